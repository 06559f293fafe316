// NCCL collectives and a DDP step on cuda:0 at world size 1 (NCCL allows one rank per GPU, so
// this is what a one-GPU machine can check; scripts/gpu-check runs it with MG_TEST_DEVICE=cuda).
// Skipped visibly without a GPU or without NCCL in the build.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "core/cuda/backend.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "optim/trainer.h"
#include "parallel/ddp.h"
#include "parallel/nccl_comm.h"
#include "cuda_skip.h"
#include "test_helpers.h"

using namespace mg;

namespace {

std::string nccl_skip_reason() {
  if (!nccl_is_built()) return "this build has no NCCL";
  return test::cuda_skip_reason();
}

#define MG_REQUIRE_NCCL() MG_SKIP_UNLESS(nccl_skip_reason())

const Device kGPU(DeviceType::cuda, 0);

}  // namespace

TEST_CASE("nccl: collectives on cuda:0 at world size 1", "[cuda][nccl]") {
  MG_REQUIRE_NCCL();
  auto g = ProcessGroup::world();
  REQUIRE(g->world_size() == 1);
  g->init_nccl();
  REQUIRE(g->nccl() != nullptr);
  CHECK(g->nccl()->device() == 0);
  const Tensor host = test::rand_tensor({6}, 3, DType::f32);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor want = cast(host, dt);
    Tensor t = to(cast(host, dt), kGPU);
    g->all_reduce(t, ReduceOp::sum);
    CHECK(to(t, kCPU).to_double_vector() == want.to_double_vector());
    g->all_reduce(t, ReduceOp::mean);
    CHECK(to(t, kCPU).to_double_vector() == want.to_double_vector());
  }
  Tensor in = to(host, kGPU), out = empty({6}, {.device = kGPU});
  g->reduce_scatter(in, out);
  CHECK(to(out, kCPU).to_double_vector() == host.to_double_vector());
  Tensor all = empty({6}, {.device = kGPU});
  g->all_gather(in, all);
  CHECK(to(all, kCPU).to_double_vector() == host.to_double_vector());
  g->broadcast(all, 0);
  CHECK(to(all, kCPU).to_double_vector() == host.to_double_vector());
  if (cuda::device_count() > 1)  // a tensor on another GPU than the communicator's is refused
    CHECK_THROWS_WITH(g->all_reduce(to(host, Device(DeviceType::cuda, 1))), Catch::Contains("drives cuda:0"));
}

TEST_CASE("nccl: a DDP step on cuda:0 at world size 1 equals a plain step (DDP, ZeRO-1, ZeRO-2)", "[cuda][nccl]") {
  MG_REQUIRE_NCCL();
  auto g = ProcessGroup::world();
  g->init_nccl();
  const GPTConfig cfg{.vocab_size = 64, .context = 8, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.0};
  const Tensor idx = to(cast(test::rand_tensor({4, 8}, 5, DType::f64, 0, 63.99), DType::i64), kGPU);
  auto run = [&](bool ddp_on, int zero) {
    Generator gen(7);
    GPT model(cfg, {.gen = &gen, .device = kGPU});
    std::unique_ptr<DistributedDataParallel> ddp;
    auto groups = weight_decay_groups(model.named_parameters(), 1e-2, 0.01);
    if (ddp_on) {
      ddp = std::make_unique<DistributedDataParallel>(model, g, DdpOptions{.bucket_bytes = 8192, .zero = zero});
      groups = ddp->optimizer_groups(groups);
    }
    AdamW opt(groups);
    Trainer trainer(model, opt, {.micro_batch = 2, .sync = ddp.get()});
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s)
      losses.push_back(trainer.step(4, [&](int64_t b, int64_t n) { return model.loss(narrow(idx, 0, b, n), narrow(idx, 0, b, n)); }).loss);
    return losses;
  };
  const std::vector<double> want = run(false, 0);
  for (int zero : {0, 1, 2}) {
    INFO("zero " << zero);
    const std::vector<double> got = run(true, zero);
    for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-6 * std::abs(want[i]));
  }
}
