// Gradual magnitude pruning (models/compress/gradual_schedule.h, MagnitudeMask::prune_to): the
// cubic schedule's values (Zhu & Gupta's formula at the update steps, held between them, final
// from the end on), and masks that rise in place: earlier zeros stay, the target sparsity is
// reached exactly, the mask bytes do not grow, and optimizer steps keep the zeros.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "models/compress/gradual_schedule.h"
#include "models/compress/magnitude_prune.h"
#include "models/compress/sparse_format.h"
#include "models/gpt.h"
#include "optim/optim.h"
#include "test_helpers.h"

using namespace mg;

TEST_CASE("prune: the gradual schedule follows Zhu & Gupta's cubic", "[prune]") {
  const GradualSchedule s{.initial = 0.1, .final = 0.8, .begin = 10, .end = 20, .every = 2};
  s.validate();
  auto cubic = [&](int64_t t) {  // s_f + (s_i - s_f) (1 - (t - t0) / (t1 - t0))^3
    const double f = 1.0 - double(t - 10) / 10.0;
    return 0.8 + (0.1 - 0.8) * f * f * f;
  };
  CHECK(s.sparsity_at(0) == 0.1);
  CHECK(s.sparsity_at(10) == 0.1);
  CHECK(s.sparsity_at(12) == Approx(cubic(12)).epsilon(1e-12));
  CHECK(s.sparsity_at(12) == Approx(0.8 - 0.7 * 0.512).epsilon(1e-12));
  CHECK(s.sparsity_at(13) == s.sparsity_at(12));  // held between updates
  CHECK(s.sparsity_at(18) == Approx(cubic(18)).epsilon(1e-12));
  CHECK(s.sparsity_at(20) == 0.8);
  CHECK(s.sparsity_at(1000) == 0.8);
  for (int64_t t = 1; t < 30; ++t) CHECK(s.sparsity_at(t) >= s.sparsity_at(t - 1));  // never falls
  // Fast early, slow late: the first update step adds more than the last one.
  CHECK(s.sparsity_at(12) - s.sparsity_at(10) > s.sparsity_at(20) - s.sparsity_at(18));
  CHECK(s.updates_at(10));
  CHECK(s.updates_at(14));
  CHECK_FALSE(s.updates_at(15));
  CHECK(s.updates_at(20));
  CHECK_FALSE(s.updates_at(22));
  CHECK(GradualSchedule::from_json(s.to_json()).sparsity_at(16) == s.sparsity_at(16));

  const GradualSchedule d = default_gradual_schedule(0.8, 100, 40);  // ramp over 30 steps, every 3
  CHECK(d.begin == 100);
  CHECK(d.end == 130);
  CHECK(d.every == 3);
  CHECK(d.sparsity_at(100) == 0.0);
  CHECK(d.sparsity_at(140) == 0.8);

  CHECK_THROWS_WITH((GradualSchedule{.initial = 0.5, .final = 0.2, .begin = 0, .end = 4}.validate()),
                    Catch::Contains("initial (0.5) <= final (0.2)"));
  CHECK_THROWS_WITH((GradualSchedule{.final = 0.5, .begin = 4, .end = 4}.validate()), Catch::Contains("must end after"));
  CHECK_THROWS_WITH((GradualSchedule{.final = 0.5, .begin = 0, .end = 4, .every = 0}.validate()),
                    Catch::Contains(">= 1 step"));
  CHECK_THROWS_WITH(default_gradual_schedule(0.5, 0, 1), Catch::Contains("--finetune-steps >= 2"));
  CHECK_THROWS_WITH(GradualSchedule::from_json({{"kind", "linear"}}), Catch::Contains("unknown schedule kind"));
}

TEST_CASE("prune: masks rise in place along the schedule and hold through optimizer steps", "[prune]") {
  const Device dev("cpu:14");
  GPT model({.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 32}, {.device = dev});
  const PruneScope scope = GENERATE(PruneScope::per_layer, PruneScope::global);
  MagnitudeMask mask(model, 0.0, scope);
  CHECK(mask.sparsity() == 0.0);
  const int64_t mask_bytes = mask.mask_bytes();
  const int64_t other = memory_stats(dev).category(MemoryCategory::other).current;

  const GradualSchedule sched{.initial = 0.0, .final = 0.75, .begin = 0, .end = 6, .every = 2};
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.01));
  int64_t t = 0;
  opt.add_post_step_hook([&] {
    ++t;
    if (sched.updates_at(t)) mask.prune_to(sched.sparsity_at(t), scope);
    else mask.apply();
  });
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7}, {2, 4}, {.dtype = DType::i64, .device = dev});
  const Tensor tgt = from_vector(std::vector<double>{5, 9, 3, 30, 2, 7, 7, 0}, {2, 4}, {.dtype = DType::i64, .device = dev});
  std::vector<std::vector<double>> prev_bits;
  double prev_sparsity = 0.0;
  for (int step = 0; step < 8; ++step) {
    backward(model.loss(idx, tgt));
    opt.step();
    opt.zero_grad();
    CHECK(mask.sparsity() == Approx(sched.sparsity_at(t)).margin(2e-3));
    CHECK(mask.sparsity() >= prev_sparsity);
    // A weight pruned before is still pruned: its mask bit stays 0 and the weight stays 0.
    std::vector<std::vector<double>> bits;
    for (size_t k = 0; k < mask.masks_state().size(); ++k) {
      bits.push_back(mask.masks_state()[k].second.to_double_vector());
      const Tensor w = prunable_weights(model)[k].second;  // a copy: the vector is a temporary
      CHECK(nonzero_bits(w).to_double_vector() == bits.back());  // zeros exactly where the mask says
    }
    if (!prev_bits.empty())
      for (size_t k = 0; k < bits.size(); ++k)
        for (size_t i = 0; i < bits[k].size(); ++i)  // bytes: a bit cleared before stays cleared
          CHECK((int(bits[k][i]) & ~int(prev_bits[k][i])) == 0);
    prev_bits = bits;
    prev_sparsity = mask.sparsity();
  }
  CHECK(mask.sparsity() == Approx(0.75).margin(2e-3));  // the final sparsity is reached
  CHECK(mask.mask_bytes() == mask_bytes);              // rewritten in place
  CHECK(memory_stats(dev).category(MemoryCategory::other).current == other);
  if (scope == PruneScope::per_layer)
    for (auto& [n, w] : prunable_weights(model))
      CHECK(count_bits(nonzero_bits(w), w.numel()) == w.numel() - int64_t(std::floor(0.75 * double(w.numel()))));
}
