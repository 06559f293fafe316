// Results do not depend on the thread count: a few training steps of a tiny GPT (with dropout)
// and a tiny MobileNetV2 (batch norm) with 1 and with 2 threads give bit-identical losses and
// parameters, and the same allocator peaks (total and per category).
#include <catch2/catch.hpp>

#include "core/allocator.h"
#include "core/parallel.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/trainer.h"

using namespace mg;

namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  int64_t peak = 0;
  std::vector<int64_t> category_peaks;
  bool operator==(const Outcome&) const = default;
};

Tensor random_ints(Shape shape, uint64_t seed, int64_t n, Device d) {
  Generator g(seed);
  std::vector<int64_t> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(g.bits_at(i) % uint64_t(n));
  return from_vector(v, shape, TensorOptions{.dtype = DType::i64, .device = d});
}

template <typename Build>
Outcome run_with_threads(int threads, const Device& dev, Build build) {
  const int saved = num_threads();
  set_num_threads(threads);
  empty_cache(dev);
  reset_peak_stats(dev);
  default_generator().manual_seed(11);
  Outcome out = build();
  const MemoryStats st = memory_stats(dev);
  out.peak = st.allocated.peak;
  for (MemoryCategory c : kAllMemoryCategories) {
    out.category_peaks.push_back(st.category(c).peak);
    out.category_peaks.push_back(st.by_category_at_peak[size_t(c)]);
  }
  set_num_threads(saved);
  return out;
}

}  // namespace

TEST_CASE("threads: 1 and 2 threads give bit-identical GPT and MobileNetV2 training", "[optim][threads]") {
  SECTION("gpt with dropout") {
    const Device dev{DeviceType::cpu, 25};
    auto build = [&] {
      const GPTConfig cfg{.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.1};
      Generator init(5);
      GPT model(cfg, {.gen = &init, .device = dev});
      AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.01));
      Trainer t(model, opt, {.micro_batch = 2});
      Outcome o;
      for (int step = 0; step < 3; ++step) {
        Tensor idx = random_ints({4, 16}, 10 + step, 32, dev), tgt = random_ints({4, 16}, 20 + step, 32, dev);
        o.losses.push_back(
            t.step(4, [&](int64_t b, int64_t n) { return model.loss(narrow(idx, 0, b, n), narrow(tgt, 0, b, n)); })
                .loss);
      }
      for (const auto& [_, p] : model.named_parameters()) o.params.push_back(p.to_double_vector());
      return o;
    };
    const Outcome one = run_with_threads(1, dev, build), two = run_with_threads(2, dev, build);
    CHECK(one.losses == two.losses);
    CHECK(one.params == two.params);
    CHECK(one.peak == two.peak);
    CHECK(one.category_peaks == two.category_peaks);
  }
  SECTION("mobilenetv2") {
    const Device dev{DeviceType::cpu, 26};
    auto build = [&] {
      Generator init(5);
      MobileNetV2 model({.width_mult = 0.25, .num_classes = 4, .small_input = true, .dropout = 0.0},
                        {.gen = &init, .device = dev});
      AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.01));
      Trainer t(model, opt, {});
      Outcome o;
      for (int step = 0; step < 3; ++step) {
        Generator g(40 + uint64_t(step));
        std::vector<double> px(4 * 3 * 8 * 8);
        for (size_t i = 0; i < px.size(); ++i) px[i] = g.normal_at(i);
        Tensor x = from_vector(px, {4, 3, 8, 8}, {.device = dev});
        Tensor y = random_ints({4}, 50 + step, 4, dev);
        o.losses.push_back(
            t.step(4, [&](int64_t b, int64_t n) { return cross_entropy(model(narrow(x, 0, b, n)), narrow(y, 0, b, n)); })
                .loss);
      }
      for (const auto& [_, p] : model.named_parameters()) o.params.push_back(p.to_double_vector());
      for (const auto& [_, b] : model.named_buffers()) o.params.push_back(b.to_double_vector());
      return o;
    };
    const Outcome one = run_with_threads(1, dev, build), two = run_with_threads(2, dev, build);
    CHECK(one.losses == two.losses);
    CHECK(one.params == two.params);
    CHECK(one.peak == two.peak);
    CHECK(one.category_peaks == two.category_peaks);
  }
}
