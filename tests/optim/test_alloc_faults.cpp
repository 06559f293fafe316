// Out-of-memory at every allocation of a training step (core/fault_injection.h fails the Nth
// allocation): for a tiny GPT and a tiny MobileNetV2, each of the step's allocations in turn.
// Without auto-fit the step fails with the allocator's breakdown; with auto-fit it recovers. In
// every case the live bytes afterwards equal those before the step: nothing leaks.
#include <catch2/catch.hpp>
#include <cstdio>

#include "core/allocator.h"
#include "core/fault_injection.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/trainer.h"

using namespace mg;

namespace {

Tensor random_ints(Shape shape, uint64_t seed, int64_t n, Device d) {
  Generator g(seed);
  std::vector<int64_t> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(g.bits_at(i) % uint64_t(n));
  return from_vector(v, shape, TensorOptions{.dtype = DType::i64, .device = d});
}

struct Sweep {
  int64_t points = 0, failed = 0, recovered = 0, leaked_bytes = 0;
};

// Runs one warm-up step, counts the allocations of a step, then fails each of them in turn.
Sweep sweep(const Device& dev, Module& model, Optimizer& opt, int64_t batch, const Trainer::MicroLoss& loss,
            bool auto_fit) {
  Trainer(model, opt, {}).step(batch, loss);  // the optimizer state exists from here on
  int64_t allocations = 0;
  {
    FaultGuard count(FaultSite::allocation, INT64_MAX);
    Trainer(model, opt, {}).step(batch, loss);
    allocations = fault_events(FaultSite::allocation);
  }
  REQUIRE(allocations > 20);
  Sweep s;
  for (int64_t n = 1; n <= allocations; ++n) {
    const int64_t before = memory_stats(dev).allocated.current;
    Trainer t(model, opt, {.auto_fit = auto_fit});
    try {
      FaultGuard fault(FaultSite::allocation, n);
      t.step(batch, loss);
      ++s.recovered;
    } catch (const OutOfMemoryError& e) {
      const std::string msg = e.what();
      if (msg.find("injected fault") == std::string::npos || msg.find("allocated by category") == std::string::npos)
        FAIL_CHECK("allocation " << n << ": " << msg);
      ++s.failed;
    }
    const int64_t after = memory_stats(dev).allocated.current;
    if (after != before) FAIL_CHECK("allocation " << n << " of " << allocations << ": " << after - before << " bytes leaked");
    s.leaked_bytes += after - before;
    ++s.points;
  }
  CHECK(s.points == allocations);
  return s;
}

}  // namespace

TEST_CASE("allocation faults: a GPT step fails cleanly or recovers at every allocation, leaking nothing",
          "[faults][optim]") {
  const Device dev{DeviceType::cpu, 23};
  const GPTConfig cfg{.vocab_size = 32, .context = 8, .n_layer = 2, .n_head = 2, .d_model = 16};
  Generator init(5);
  GPT model(cfg, {.gen = &init, .device = dev});
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.0));
  const int64_t batch = 4;
  Tensor idx = random_ints({batch, cfg.context}, 1, 32, dev), tgt = random_ints({batch, cfg.context}, 2, 32, dev);
  auto loss = [&](int64_t b, int64_t n) { return model.loss(narrow(idx, 0, b, n), narrow(tgt, 0, b, n)); };
  for (bool auto_fit : {false, true}) {
    Sweep s = sweep(dev, model, opt, batch, loss, auto_fit);
    std::printf("allocation faults: gpt tiny step, auto-fit %s: %lld fault points, %lld failed with the breakdown, "
                "%lld recovered, %lld bytes leaked\n",
                auto_fit ? "on" : "off", (long long)s.points, (long long)s.failed, (long long)s.recovered,
                (long long)s.leaked_bytes);
    CHECK(s.leaked_bytes == 0);
    if (!auto_fit) CHECK(s.failed == s.points);
    else CHECK(s.recovered > 0);
  }
}

TEST_CASE("allocation faults: a MobileNetV2 step fails cleanly or recovers at every allocation, leaking nothing",
          "[faults][optim][slow]") {
  const Device dev{DeviceType::cpu, 24};
  Generator init(5);
  MobileNetV2 model({.width_mult = 0.25, .num_classes = 4, .small_input = true, .dropout = 0.0},
                    {.gen = &init, .device = dev});
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.0));
  const int64_t batch = 4;  // auto-fit halves it to 2 (batch norm needs 2 values per channel at 1x1)
  Generator g(9);
  std::vector<double> px(size_t(batch * 3 * 8 * 8));
  for (size_t i = 0; i < px.size(); ++i) px[i] = g.normal_at(i);
  Tensor x = from_vector(px, {batch, 3, 8, 8}, {.device = dev});
  Tensor y = random_ints({batch}, 3, 4, dev);
  auto loss = [&](int64_t b, int64_t n) { return cross_entropy(model(narrow(x, 0, b, n)), narrow(y, 0, b, n)); };
  Sweep s = sweep(dev, model, opt, batch, loss, /*auto_fit=*/true);
  std::printf("allocation faults: mobilenetv2 tiny step, auto-fit on: %lld fault points, %lld failed with the "
              "breakdown, %lld recovered, %lld bytes leaked\n",
              (long long)s.points, (long long)s.failed, (long long)s.recovered, (long long)s.leaked_bytes);
  CHECK(s.leaked_bytes == 0);
}
