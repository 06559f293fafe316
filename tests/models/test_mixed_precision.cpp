// Mixed precision end to end on gpt-mini (GPTConfig::named("gpt-mini"), 2 x 64 tokens of a
// learnable pattern): one step's gradients under bf16 and fp16 autocast are within a tight bound of
// fp32's at the same weights (the deterministic check of the precision itself); over 200 AdamW
// steps the bf16 / fp16 autocast and bf16-pure loss curves stay within a stated bound of fp32's
// (a looser check: the curves amplify any early perturbation, see that case); an fp16 run started at an overflowing loss scale (2^40) skips
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

// MG_CURVE_PERTURBATION=R: multiply every initial fp32 weight by (1 + R * N(0, 1)) (seed
// MG_CURVE_SEED), to measure how far a curve moves from a perturbation alone (see below).
void perturb(GPT& model) {
  const char* r = std::getenv("MG_CURVE_PERTURBATION");
  if (!r) return;
  const char* seed = std::getenv("MG_CURVE_SEED");
  const Generator noise{seed ? uint64_t(std::atoll(seed)) : 1};
  uint64_t pos = 0;
  for (auto& [name, p] : model.named_parameters()) {
    float* d = p.data<float>();
    for (int64_t i = 0; i < p.numel(); ++i) d[i] *= float(1.0 + std::atof(r) * noise.normal_at(pos++));
  }
}

Run train(Mode mode, int steps, double init_scale = 65536.0) {
  GPTConfig cfg = GPTConfig::named("gpt-mini");
  Generator gen(7);
  GPT model(cfg, InitOptions{.gen = &gen});
  if (mode == Mode::fp32) perturb(model);
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

// The relative L2 error of every parameter's gradient together, autocast against fp32, for one
// batch at the model's current weights.
double gradient_error(GPT& model, DType autocast_dtype, const Tensor& x, const Tensor& y) {
  auto grads = [&](std::optional<DType> dt) {
    for (auto& [_, p] : model.named_parameters()) p.set_grad(Tensor());
    Tensor loss;
    {
      std::optional<AutocastGuard> amp;
      if (dt) amp.emplace(*dt);
      loss = model.loss(x, y);
    }
    backward(dt == DType::f16 ? mul(loss, 65536.0) : loss);  // fp16 as GradScaler runs it
    std::vector<double> g;
    for (auto& [_, p] : model.named_parameters())
      for (double v : p.grad().to_double_vector()) g.push_back(dt == DType::f16 ? v / 65536.0 : v);
    return g;
  };
  const std::vector<double> ref = grads(std::nullopt), got = grads(autocast_dtype);
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) err += (got[i] - ref[i]) * (got[i] - ref[i]), norm += ref[i] * ref[i];
  for (auto& [_, p] : model.named_parameters()) p.set_grad(Tensor());
  return std::sqrt(err / norm);
}

}  // namespace

TEST_CASE("mixed precision: one step's gradients under bf16 and fp16 autocast are close to fp32's") {
  // Measured (MG_PRINT_CURVES=1) on an AMD EPYC (Zen 4): at the initial weights bf16 0.0072, fp16
  // 0.00087; after 30 fp32 steps bf16 0.0098, fp16 0.00088 (fp16 keeps 3 more mantissa bits).
  GPTConfig cfg = GPTConfig::named("gpt-mini");
  Generator gen(7);
  GPT model(cfg, InitOptions{.gen = &gen});
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-3, 0.01));
  for (int phase = 0; phase < 2; ++phase) {
    INFO("after " << phase * 30 << " fp32 steps");
    for (int s = 0; phase == 1 && s < 30; ++s) {
      auto [x, y] = batch(s, 2, 64, cfg.vocab_size);
      backward(model.loss(x, y));
      opt.step();
      opt.zero_grad();
    }
    auto [x, y] = batch(500, 2, 64, cfg.vocab_size);
    const double bf16 = gradient_error(model, DType::bf16, x, y), fp16 = gradient_error(model, DType::f16, x, y);
    if (std::getenv("MG_PRINT_CURVES")) std::printf("gradient error: bf16 %.3g, fp16 %.3g\n", bf16, fp16);
    CHECK(bf16 < 0.015);
    CHECK(fp16 < 0.002);
    CHECK(fp16 < bf16 / 3);
  }
}

TEST_CASE("mixed precision: gpt-mini loss curves over 200 steps stay close to fp32's", "[slow]") {
  constexpr int kSteps = 200;
  // Stated bounds on the smoothed curves' largest deviation from fp32 (in nats; the loss falls
  // from 5.63 to 2.72), measured with MG_PRINT_CURVES=1 on an AMD EPYC (Zen 4, AVX-512): bf16
  // 0.269, fp16 0.489, bf16-pure 0.070 with the converting bf16 GEMM; with AVX512-BF16's
  // vdpbf16ps GEMM (ops/cpu_gemm_bf16.cpp, other roundings of the same sums) bf16 0.167, fp16
  // 0.489, bf16-pure 0.314; bounds: the larger of each plus ~15%. These bounds are about the
  // trajectory, not the precision: the curves amplify any perturbation of the first steps, the
  // loss falling steepest there. The fp32 run alone, its initial weights multiplied once by
  // (1 + r N(0,1)) (MG_CURVE_PERTURBATION=r MG_CURVE_SEED=s, then fp32 against fp32), moves by
  // 0.06, 0.06, 0.26 at r = 5e-4 (f16's rounding; seeds 1-3) and 0.34, 0.09, 0.19 at r = 4e-3
  // (bf16's; seeds 4-6): as far as the autocast runs, from one perturbation at the start.
  // fp16 autocast's gradients are 8x closer to fp32's than bf16's (the case above), yet its curve
  // moves further: which way the first steps are pushed matters, not how far.
  constexpr double kBoundAutocast = 0.31, kBoundFp16 = 0.56, kBoundPure = 0.36;
  const Run ref = train(Mode::fp32, kSteps);
  REQUIRE(ref.losses.back() < ref.losses.front() - 1.0);  // the pattern is being learned
  if (std::getenv("MG_CURVE_PERTURBATION")) {  // a perturbed fp32 run against the unperturbed one
    unsetenv("MG_CURVE_PERTURBATION");
    const Run base = train(Mode::fp32, kSteps);
    std::printf("perturbed fp32 last %.4f (fp32 %.4f) max smoothed deviation %.4f\n", ref.losses.back(),
                base.losses.back(), max_deviation(ref.losses, base.losses));
    return;
  }
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
