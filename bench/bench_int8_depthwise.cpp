// Int8 depthwise 3x3 convolution (ops/int8_depthwise.h) against the f32 depthwise conv2d that
// MobileNetV2's quantized model runs today (Int8WeightOnlyConv2d: f32 math on dequantized weights),
// on MobileNetV2-32's depthwise shapes at batch 64, stride 1 and 2. The int8 kernel reads u8 and
// writes u8 (the quantized MobileNetV2's chain expand -> depthwise -> project), once per path
// (ops/int8_isa.h: 0 scalar, 1 AVX2, 2 AVX-512 VNNI; a path this CPU lacks is skipped).
// Run: OMP_NUM_THREADS=1 build/release/bench/bench_int8_depthwise --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cstdint>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/int8_depthwise.h"
#include "ops/int8_isa.h"
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

// args: C, H (= W), stride; batch 64, 3x3, padding 1
void BM_DepthwiseF32(benchmark::State& state) {
  mg::NoGradGuard ng;
  const int64_t N = 64, C = state.range(0), H = state.range(1), S = state.range(2);
  mg::Tensor x = random_f32({N, C, H, H}, 1, 0.f, 6.f), w = random_f32({C, 1, 3, 3}, 2, -1.f, 1.f);
  for (auto _ : state) benchmark::DoNotOptimize(mg::conv2d(x, w, mg::Tensor(), {.stride = S, .padding = 1, .groups = C}));
  set_rate(state, N, C, (H / S) * (H / S));
}

// args: C, H, stride, path
void BM_DepthwiseInt8(benchmark::State& state) {
  mg::NoGradGuard ng;
  const int64_t N = 64, C = state.range(0), H = state.range(1), S = state.range(2);
  const auto isa = mg::Int8Isa(state.range(3));
  if (int(isa) > int(mg::int8_isa_supported())) {
    state.SkipWithError("this CPU lacks the path");
    return;
  }
  const mg::Int8Isa before = mg::set_int8_isa(isa);
  mg::Tensor x = random_f32({N, C, H, H}, 1, 0.f, 6.f), w = random_f32({C, 1, 3, 3}, 2, -1.f, 1.f);
  const mg::QuantizedChannels q = mg::quantize_per_channel(w);
  const mg::ActivationQParams aq = mg::choose_qparams_u8(0.f, 6.f);
  mg::Tensor scale = mg::mul(q.scales, double(aq.scale)), xq = mg::quantize_per_tensor(x, aq);
  const mg::Int8DepthwiseShape s{.N = N, .C = C, .H = H, .W = H, .K = 3, .stride = S, .padding = 1};
  mg::Tensor y = mg::empty({N, C, s.OH(), s.OW()}, {.dtype = mg::DType::u8});
  const mg::Int8DepthwiseOut out{.u8 = y.data<uint8_t>(), .scale = scale.data<float>(),
                                 .q = {.lo = 0.f, .hi = 6.f, .out_inv_scale = 1.f / aq.scale, .out_zero = aq.zero_point}};
  for (auto _ : state) {
    mg::int8_depthwise(s, xq.data<uint8_t>(), aq.zero_point, q.values.data<int8_t>(), out);
    benchmark::DoNotOptimize(y.data<uint8_t>());
  }
  set_rate(state, N, C, s.OH() * s.OW());
  state.SetLabel(mg::int8_depthwise_path());
  mg::set_int8_isa(before);
}

// mobilenetv2-32's depthwise layers (width 1.0): 96 x 32x32 (block 2), 192 x 16x16 (block 4), 576 x 8x8
// (blocks 11-13), and stride 2: 144 x 32x32 (block 3), 384 x 8x8 (block 14)
BENCHMARK(BM_DepthwiseF32)->Args({96, 32, 1})->Args({192, 16, 1})->Args({576, 8, 1})->Args({144, 32, 2})
    ->Args({384, 8, 2})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DepthwiseInt8)->ArgsProduct({{96}, {32}, {1}, {0, 1, 2}})->ArgsProduct({{192}, {16}, {1}, {0, 1, 2}})
    ->ArgsProduct({{576}, {8}, {1}, {0, 1, 2}})->ArgsProduct({{144}, {32}, {2}, {0, 1, 2}})
    ->ArgsProduct({{384}, {8}, {2}, {0, 1, 2}})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
