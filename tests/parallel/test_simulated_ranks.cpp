// ProcessGroup::simulated (Note [Simulated ranks]): one process standing for rank r of N checks
// each collective's arguments as a real group does, moves nothing, counts the bytes, and refuses
// tensors that hold data; DDP over it runs a step on meta whose ZeRO state is this rank's shard.
#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "parallel/ddp.h"
#include "parallel/process_group.h"

using namespace mg;

TEST_CASE("simulated ranks: collectives check their arguments and count their bytes and refuse host tensors", "[parallel]") {
  const Device meta(DeviceType::meta, 0);
  auto g = ProcessGroup::simulated(1, 4);
  CHECK(g->is_simulated());
  CHECK(g->rank() == 1);
  CHECK(g->world_size() == 4);
  Tensor t = empty({10}, {.device = meta}), shard = empty({10}, {.device = meta}), all = empty({40}, {.device = meta});
  g->all_reduce(t);
  g->reduce_scatter(all, shard);
  g->all_gather(shard, all);
  g->broadcast(t, 3);
  g->barrier();
  CHECK(g->all_reduce_scalar(2.5) == 10.0);  // as if every rank held 2.5
  CHECK(g->all_reduce_scalar(2.5, ReduceOp::mean) == 2.5);
  CHECK(g->broadcast_string("abc") == "abc");
  const ProcessGroup::Traffic tr = g->traffic();
  CHECK(tr.all_reduce == 40 + 2 * 8);  // the tensor and the two f64 scalars
  CHECK(tr.reduce_scatter == 160);
  CHECK(tr.all_gather == 160);
  CHECK(tr.broadcast == 40 + 8 + 3);  // the tensor, the string's length and its bytes
  CHECK_THROWS_WITH(g->all_reduce(zeros({3})), Catch::Contains("moves meta tensors only") && Catch::Contains("cpu:0"));
  CHECK_THROWS_WITH(g->reduce_scatter(all, empty({9}, {.device = meta})), Catch::Contains("expected world size 4"));
  CHECK_THROWS_WITH(g->broadcast(t, 4), Catch::Contains("root 4 is not a rank of 4"));
  CHECK_THROWS_WITH(g->init_nccl(), Catch::Contains("no NCCL"));
  CHECK_THROWS_WITH(ProcessGroup::simulated(4, 4), Catch::Contains("rank 4 of 4 ranks does not exist"));
}

TEST_CASE("simulated ranks: DDP on meta holds this rank's ZeRO shard of the optimizer state", "[parallel]") {
  const Device meta(DeviceType::meta, 0);
  const GPTConfig cfg{.vocab_size = 64, .context = 8, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.0};
  auto state_bytes = [&](int zero, int rank, int world) {
    empty_cache(meta);
    Generator gen(1);
    GPT model(cfg, {.gen = &gen, .device = meta});
    DistributedDataParallel ddp(model, ProcessGroup::simulated(rank, world), {.bucket_bytes = 16 << 10, .zero = zero});
    AdamW opt(ddp.optimizer_groups(weight_decay_groups(model.named_parameters(), 1e-3, 0.0)));
    const int64_t before = memory_stats(meta).category(MemoryCategory::optimizer_state).current;
    opt.allocate_state();
    return memory_stats(meta).category(MemoryCategory::optimizer_state).current - before;
  };
  const int64_t whole = state_bytes(0, 0, 2);
  int64_t shards = 0;
  for (int r = 0; r < 3; ++r) shards += state_bytes(1, r, 3);
  // The three shards hold the whole state, within the allocator's 512-byte rounding of each
  // piece's two moments (a parameter cut by a shard boundary is two pieces: at most one extra
  // piece per bucket and rank) and the buckets' padding.
  const int64_t tensors = int64_t(GPT(cfg, {.device = meta}).named_parameters().size());
  CHECK(whole > 0);
  CHECK(shards >= whole - 2 * 512 * tensors);
  CHECK(shards <= whole + 3 * 2 * 512 * (tensors + 16));
  CHECK(state_bytes(1, 0, 3) < whole / 2);
  // A simulated group's DDP refuses host parameters: their gradients would never be summed.
  GPT on_cpu(cfg, {});
  CHECK_THROWS_WITH(DistributedDataParallel(on_cpu, ProcessGroup::simulated(0, 2)), Catch::Contains("moves meta tensors only"));
}
