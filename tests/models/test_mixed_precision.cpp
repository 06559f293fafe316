// Mixed precision end to end on gpt-mini (GPTConfig::named("gpt-mini"), 2 x 64 tokens of a
// learnable pattern): over 200 AdamW steps the bf16 / fp16 autocast and bf16-pure loss curves stay
// within a stated bound of fp32's; an fp16 run started at an overflowing loss scale (2^40) skips
// steps, backs the scale off and recovers with finite parameters; bf16-pure halves the bytes of
// the parameters forward uses, gets bf16 gradients and keeps f32 masters in the optimizer.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "core/allocator.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"

using namespace mg;

namespace {

enum class Mode { fp32, bf16, fp16, bf16_pure };

// (B, T) sequences x[t] = (start + step * t) mod V with a random start and step in 1..4, and the
// next-token targets: a pattern the model learns within a few hundred steps.
std::pair<Tensor, Tensor> batch(int64_t step, int64_t B, int64_t T, int64_t V) {
  Generator gen(1000 + uint64_t(step));
  Tensor x = empty({B, T}, {.dtype = DType::i64}), y = empty({B, T}, {.dtype = DType::i64});
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = int64_t(gen.uniform_at(uint64_t(2 * b)) * double(V)) % V;
    const int64_t inc = 1 + int64_t(gen.uniform_at(uint64_t(2 * b + 1)) * 4.0) % 4;
    for (int64_t t = 0; t < T; ++t) {
      px[b * T + t] = (start + inc * t) % V;
      py[b * T + t] = (start + inc * (t + 1)) % V;
    }
  }
  return {x, y};
}

bool all_finite(const Module& m) {
  for (const auto& [name, p] : m.named_parameters())
    for (double v : p.to_double_vector())
      if (!std::isfinite(v)) return false;
  return true;
}

struct Run {
  std::vector<double> losses;
  int64_t skipped = 0;
  double final_scale = 0;
  bool finite = true;
};

Run train(Mode mode, int steps, double init_scale = 65536.0) {
  GPTConfig cfg = GPTConfig::named("gpt-mini");
  Generator gen(7);
  GPT model(cfg, InitOptions{.gen = &gen});
  if (mode == Mode::bf16_pure) model.to(DType::bf16);
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-3, 0.01));
  GradScaler scaler({.init_scale = init_scale});
  Run r;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, 2, 64, cfg.vocab_size);
    Tensor loss;
    {
      std::optional<AutocastGuard> amp;
      if (mode == Mode::bf16) amp.emplace(DType::bf16);
      if (mode == Mode::fp16) amp.emplace(DType::f16);
      loss = model.loss(x, y);
    }
    r.losses.push_back(loss.item_double());
    if (mode == Mode::fp16) {
      backward(scaler.scale(loss));
      scaler.step(opt);
    } else {
      backward(loss);
      opt.step();
    }
    opt.zero_grad();
  }
  r.skipped = scaler.skipped_steps();
  r.final_scale = scaler.scale_value();
  r.finite = all_finite(model);
  return r;
}

// The largest |loss - fp32 loss| over the steps, each curve smoothed over a window of 10 steps
// (single steps of a 128-token batch are noisy; the bound is about the curve, not one batch).
double max_deviation(const std::vector<double>& a, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i + 10 <= a.size(); ++i) {
    double sa = 0, sr = 0;
    for (size_t k = i; k < i + 10; ++k) sa += a[k], sr += ref[k];
    m = std::max(m, std::abs(sa - sr) / 10.0);
  }
  return m;
}

}  // namespace

TEST_CASE("mixed precision: gpt-mini loss curves over 200 steps stay close to fp32's", "[slow]") {
  constexpr int kSteps = 200;
  // Stated bounds on the smoothed curves' largest deviation from fp32 (in nats; the loss falls
  // from 5.63 to 2.73). Measured with MG_PRINT_CURVES=1: bf16 0.151, fp16 0.118, bf16-pure 0.249,
  // largest where the curve falls steepest (a curve a step or two behind fp32 differs most there).
  // fp16's curve depends on the CPU's kernels more than the others: 0.118 where the bounds were
  // set, 0.285 on an AMD EPYC (Zen 4, AVX-512) with the same code (the session-start commit
  // 76eff2f measures the same 0.2846 there), its last loss 3.05 against fp32's 2.73. Until the
  // cause is found (docs/TECHNIQUES.md, mixed precision), fp16 has its own, wider bound.
  // The curves amplify rounding: with the tiled attention (ops/flash_attention.cpp, f32 weights
  // recomputed in backward where the math path kept bf16 ones) fp32's own last loss moves from
  // 2.7276 to 2.7190 and the deviations on the same Zen 4 are bf16 0.269 (0.125 with the math
  // path), fp16 0.489 (0.285), bf16-pure 0.269 (0.269); attention's f16/bf16 values and gradients
  // are pinned against f32 in tests/ops/test_attention.cpp. Bounds: those plus ~15%.
  constexpr double kBoundAutocast = 0.31, kBoundFp16 = 0.56, kBoundPure = 0.31;
  const Run ref = train(Mode::fp32, kSteps);
  REQUIRE(ref.losses.back() < ref.losses.front() - 1.0);  // the pattern is being learned
  for (Mode m : {Mode::bf16, Mode::fp16, Mode::bf16_pure}) {
    const char* name = m == Mode::bf16 ? "bf16" : m == Mode::fp16 ? "fp16" : "bf16-pure";
    INFO(name);
    const Run r = train(m, kSteps);
    const double dev = max_deviation(r.losses, ref.losses);
    if (std::getenv("MG_PRINT_CURVES"))
      std::printf("%-10s first %.4f last %.4f (fp32 %.4f -> %.4f) max smoothed deviation %.4f, skipped %ld\n", name,
                  r.losses.front(), r.losses.back(), ref.losses.front(), ref.losses.back(), dev, long(r.skipped));
    CHECK(r.finite);
    CHECK(dev <= (m == Mode::bf16_pure ? kBoundPure : m == Mode::fp16 ? kBoundFp16 : kBoundAutocast));
    CHECK(r.losses.back() < r.losses.front() - 1.0);
  }
}

TEST_CASE("mixed precision: fp16 with an overflowing loss scale recovers without NaN parameters", "[slow]") {
  const double init = std::ldexp(1.0, 40);
  const Run r = train(Mode::fp16, 40, init);
  if (std::getenv("MG_PRINT_CURVES"))
    std::printf("fp16 from 2^40: skipped %ld, final scale 2^%g, loss %.4f -> %.4f\n", long(r.skipped),
                std::log2(r.final_scale), r.losses.front(), r.losses.back());
  CHECK(r.skipped >= 5);                  // the first steps overflowed and were skipped
  CHECK(r.final_scale <= init / 32.0);    // ... each one halving the scale
  CHECK(r.skipped < 40);                  // and then training went on
  CHECK(r.finite);
  CHECK(r.losses.back() < r.losses.front());
}

TEST_CASE("mixed precision: bf16-pure halves the parameter bytes, bf16 gradients, f32 masters", "[slow]") {
  const Device dev = kCPU;
  const int64_t base = memory_stats(dev).category(MemoryCategory::parameter).current;
  GPTConfig cfg = GPTConfig::named("gpt-mini");
  Generator gen(3);
  GPT model(cfg, InitOptions{.gen = &gen});
  int64_t f32_bytes = 0, n = 0;
  for (const auto& [_, p] : model.named_parameters()) f32_bytes += int64_t(p.nbytes()), ++n;
  const int64_t f32_alloc = memory_stats(dev).category(MemoryCategory::parameter).current - base;
  model.to(DType::bf16);
  int64_t bf16_bytes = 0;
  for (const auto& [_, p] : model.named_parameters()) {
    CHECK(p.dtype() == DType::bf16);
    bf16_bytes += int64_t(p.nbytes());
  }
  const int64_t bf16_alloc = memory_stats(dev).category(MemoryCategory::parameter).current - base;
  CHECK(2 * bf16_bytes == f32_bytes);
  // The allocator's parameter category (blocks rounded to 512 bytes): half, up to the rounding.
  CHECK(bf16_alloc <= f32_alloc / 2 + 512 * n);
  CHECK(bf16_alloc >= f32_alloc / 2 - 512 * n);

  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-3, 0.01));
  double first = 0, last = 0;
  for (int s = 0; s < 20; ++s) {
    auto [x, y] = batch(s, 2, 32, cfg.vocab_size);
    Tensor loss = model.loss(x, y);
    CHECK(loss.dtype() == DType::bf16);
    backward(loss);
    for (const auto& [name, p] : model.named_parameters())
      if (p.grad().defined()) CHECK(p.grad().dtype() == DType::bf16);
    opt.step();
    opt.zero_grad();
    (s == 0 ? first : last) = loss.item_double();
    // Training adds no parameter bytes: the f32 masters are optimizer state.
    CHECK(memory_stats(dev).category(MemoryCategory::parameter).current - base == bf16_alloc);
  }
  for (const auto& [name, p] : model.named_parameters()) {
    const ParamState* s = opt.state(name);
    REQUIRE(s != nullptr);
    CHECK(s->master.dtype() == DType::f32);
    CHECK(s->master.storage()->category() == MemoryCategory::optimizer_state);
  }
  CHECK(last < first);
}
