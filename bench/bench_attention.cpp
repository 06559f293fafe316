// Attention forward + backward, the default tiled (flash) path against the materialised one
// (scaled_dot_product_attention_math), f32 causal, as GPT calls it: q, k, v are (B, T, NH, HS)
// views. Counters: `own_MiB`, the allocator peak of one forward + backward beyond its inputs,
// output and gradients (what attention itself needs), and the time per iteration.
// Run: build/release/bench/bench_attention --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/rng.h"
#include "ops/ops.h"

using namespace mg;

namespace {

Tensor randn(const Shape& s, uint64_t seed) {
  Tensor t = empty(s);
  float* p = t.data<float>();
  Generator g(seed);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = g.normal_at(uint64_t(i));
  return t;
}

template <bool kFlash>
void BM_attention(benchmark::State& state) {
  const int64_t B = state.range(0), NH = state.range(1), T = state.range(2), HS = 64;
  Tensor q = randn({B, T, NH, HS}, 1), k = randn({B, T, NH, HS}, 2), v = randn({B, T, NH, HS}, 3);
  q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
  Tensor dout = randn({B, NH, T, HS}, 4);
  auto step = [&] {
    Tensor qh = transpose(q, 1, 2), kh = transpose(k, 1, 2), vh = transpose(v, 1, 2);
    Tensor out = kFlash ? scaled_dot_product_attention(qh, kh, vh, true) : scaled_dot_product_attention_math(qh, kh, vh, true);
    backward(out, dout);
    for (const Tensor& t : {q, k, v}) t.set_grad(Tensor());
  };
  step();  // warm-up, then the memory of one step
  const int64_t base = memory_stats(kCPU).allocated.current;
  reset_peak_stats(kCPU);
  step();
  const int64_t io = 4 * B * NH * T * HS * 4;  // out and three gradients
  const double own = double(memory_stats(kCPU).allocated.peak - base - io);
  for (auto _ : state) step();
  state.counters["own_MiB"] = own / (1024.0 * 1024.0);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({8, 4, 128})->Args({8, 8, 256})->Args({2, 8, 512})->Args({1, 12, 1024})->Args({1, 4, 2048});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_TEMPLATE(BM_attention, true)->Name("flash")->Apply(shapes);
BENCHMARK_TEMPLATE(BM_attention, false)->Name("math")->Apply(shapes);
BENCHMARK_MAIN();
