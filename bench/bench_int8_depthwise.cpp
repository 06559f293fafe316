// Int8 depthwise 3x3 convolution (ops/int8_depthwise.h) against the f32 depthwise conv2d that
// MobileNetV2's quantized model runs today (Int8WeightOnlyConv2d: f32 math on dequantized weights),
// on MobileNetV2-32's depthwise shapes at batch 64, stride 1. The int8 timing includes quantizing
// the f32 input to u8 (what an int8 layer fed by f32 activations must do) and writes f32 outputs.
// Run: OMP_NUM_THREADS=1 build/release/bench/bench_int8_depthwise --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cstdint>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/int8_depthwise.h"
#include "ops/ops.h"
#include "ops/quantize.h"

namespace {

mg::Tensor random_f32(const mg::Shape& shape, uint64_t seed, float lo, float hi) {
  mg::Tensor t = mg::empty(shape);
  mg::Generator gen(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * gen.uniform_at(uint64_t(i));
  return t;
}

void set_rate(benchmark::State& state, int64_t N, int64_t C, int64_t HW) {
  state.counters["Gtap/s"] = benchmark::Counter(9.0 * double(N * C * HW) * 1e-9 * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

// args: C, H (= W); batch 64, 3x3, stride 1, padding 1
void BM_DepthwiseF32(benchmark::State& state) {
  mg::NoGradGuard ng;
  const int64_t N = 64, C = state.range(0), H = state.range(1);
  mg::Tensor x = random_f32({N, C, H, H}, 1, 0.f, 6.f), w = random_f32({C, 1, 3, 3}, 2, -1.f, 1.f);
  for (auto _ : state) benchmark::DoNotOptimize(mg::conv2d(x, w, mg::Tensor(), {.stride = 1, .padding = 1, .groups = C}));
  set_rate(state, N, C, H * H);
}

void BM_DepthwiseInt8(benchmark::State& state) {
  mg::NoGradGuard ng;
  const int64_t N = 64, C = state.range(0), H = state.range(1);
  mg::Tensor x = random_f32({N, C, H, H}, 1, 0.f, 6.f), w = random_f32({C, 1, 3, 3}, 2, -1.f, 1.f);
  const mg::QuantizedChannels q = mg::quantize_per_channel(w);
  const mg::ActivationQParams aq = mg::choose_qparams_u8(0.f, 6.f);
  mg::Tensor scale = mg::mul(q.scales, double(aq.scale)), y = mg::empty({N, C, H, H});
  const mg::Int8DepthwiseShape s{.N = N, .C = C, .H = H, .W = H, .K = 3, .stride = 1, .padding = 1};
  for (auto _ : state) {
    mg::Tensor xq = mg::quantize_per_tensor(x, aq);
    mg::int8_depthwise_f32(s, xq.data<uint8_t>(), aq.zero_point, q.values.data<int8_t>(), scale.data<float>(), nullptr,
                           -3.4e38f, 3.4e38f, y.data<float>());
    benchmark::DoNotOptimize(y.data<float>());
  }
  set_rate(state, N, C, H * H);
  state.SetLabel(mg::int8_depthwise_path());
}

// mobilenetv2-32's depthwise layers: 96 x 32x32 (block 2), 192 x 16x16 (block 4), 576 x 8x8 (blocks 11-13)
BENCHMARK(BM_DepthwiseF32)->Args({96, 32})->Args({192, 16})->Args({576, 8})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DepthwiseInt8)->Args({96, 32})->Args({192, 16})->Args({576, 8})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
