// batch_norm_relu6's training forward (batch statistics, normalise, clamp) on mobilenetv2-32's
// NCHW shapes at batch 64 and 16, reported as GB/s of x read once and y written once. The
// channel counts 96, 144 and 192 make one channel's planes sit a multiple of 128 KiB apart (the
// L2's set stride on many cores), 97 does not: the pair shows what the planes' placement costs.
// Run: OMP_NUM_THREADS=1 build/<dir>/bench/bench_batch_norm --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>

#include "autograd/grad_mode.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace {

mg::Tensor filled(const mg::Shape& s, double scale, double freq) {
  mg::Tensor t = mg::empty(s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(scale * std::sin(freq * double(i) + 0.1));
  return t;
}

// Args: N, C, H (= W).
void BM_BatchNormRelu6Forward(benchmark::State& state) {
  const int64_t n = state.range(0), c = state.range(1), hw = state.range(2);
  mg::NoGradGuard no_grad;
  const mg::Tensor x = filled({n, c, hw, hw}, 2.0, 0.37);
  const mg::Tensor w = filled({c}, 1.0, 0.23), b = filled({c}, 0.5, 0.5);
  mg::Tensor rm = mg::zeros({c}), rv = mg::ones({c});
  for (auto _ : state) {
    mg::Tensor y = mg::batch_norm_relu6(x, rm, rv, w, b, /*training=*/true, 0.1, 1e-5);
    benchmark::DoNotOptimize(y.data<float>());
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * 4.0 * double(x.numel()) * double(state.iterations()) * 1e-9,
                                              benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_BatchNormRelu6Forward)
    ->ArgNames({"N", "C", "HW"})
    ->Args({64, 96, 32})
    ->Args({64, 97, 32})
    ->Args({64, 144, 16})
    ->Args({64, 192, 8})
    ->Args({16, 96, 32})
    ->Args({16, 144, 16})
    ->Args({16, 192, 8})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
