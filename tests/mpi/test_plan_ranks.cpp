// The planner's data-parallel rows under mpirun: a rank simulated on meta (ProcessGroup::simulated,
// Note [Simulated ranks]) allocates what the same rank allocates on cpu:0 in a real job, byte for
// byte per category, and hands the collectives the same bytes, for DDP, ZeRO-1 and ZeRO-2, with and
// without accumulation, on a GPT (dropout, several buckets) and a MobileNetV2 (buffers broadcast).
#include <catch2/catch.hpp>

#include "apps/plan_step.h"
#include "core/allocator.h"
#include "parallel/process_group.h"

namespace mg {
namespace {

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> g = ProcessGroup::world(std::chrono::seconds(30));
  return g;
}

void require_same_traffic(const ProcessGroup::Traffic& a, const ProcessGroup::Traffic& b) {
  CHECK(a.all_reduce == b.all_reduce);
  CHECK(a.reduce_scatter == b.reduce_scatter);
  CHECK(a.all_gather == b.all_gather);
  CHECK(a.broadcast == b.broadcast);
}

void check_rank_equals_simulation(const PlanWorkload& w) {
  auto g = world();
  const int N = g->world_size();
  for (int zero : {0, 1, 2})
    for (int64_t micro : {int64_t(0), w.batch / N / 2}) {
      TechniqueOptions t;
      t.micro_batch = micro;
      DataParallelOptions real{.enabled = true, .zero = zero, .bucket_mb = 0.0625, .group = g};
      DataParallelOptions sim = real;
      sim.group = ProcessGroup::simulated(g->rank(), N);
      const StepMeasurement on_cpu = measure_step(w, t, kCPU, 3, {}, {}, real);
      const StepMeasurement on_meta = measure_step(w, t, Device(DeviceType::meta, 0), 3, {}, {}, sim);
      INFO(w.name << " on rank " << g->rank() << " of " << N << ", ZeRO-" << zero << ", micro-batch " << micro);
      CHECK(on_meta.memory.peak == on_cpu.memory.peak);
      CHECK(on_meta.memory.reserved == on_cpu.memory.reserved);
      for (MemoryCategory c : kAllMemoryCategories) {
        INFO(category_name(c));
        CHECK(on_meta.memory.category[size_t(c)] == on_cpu.memory.category[size_t(c)]);
      }
      require_same_traffic(on_meta.traffic, on_cpu.traffic);
      CHECK(on_cpu.traffic.all_reduce + on_cpu.traffic.reduce_scatter > 0);  // the gradients did travel
    }
}

}  // namespace

TEST_CASE("plan ranks: a simulated GPT rank allocates what the real rank does (DDP, ZeRO-1, ZeRO-2)", "[mpi]") {
  PlanWorkload w;
  w.name = "tiny-gpt";
  w.gpt = GPTConfig{.vocab_size = 64, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.1};
  w.batch = 4 * world()->world_size();
  w.grad_clip = 1.0;
  w.prefetch = 2;
  check_rank_equals_simulation(w);
}

TEST_CASE("plan ranks: a simulated MobileNetV2 rank allocates what the real rank does (DDP, ZeRO-1, ZeRO-2)", "[mpi]") {
  PlanWorkload w;
  w.name = "tiny-mobilenetv2";
  w.mobilenet = MobileNetV2Config{.width_mult = 0.25, .num_classes = 10, .in_channels = 1, .small_input = true, .input_size = 16};
  w.batch = 4 * world()->world_size();
  w.optimizer = OptimizerKind::sgd;
  w.prefetch = 2;
  check_rank_equals_simulation(w);
}

}  // namespace mg
