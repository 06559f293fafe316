// int8 GEMM (ops/int8_gemm.h: the activations quantized and packed on the fly, int32 products,
// requantized to f32 with a per-row scale and bias) against the f32 GEMM mg::matmul uses
// (cpu_gemm) on the same shapes: square n x n and MobileNetV2-32's pointwise convolutions at batch
// 64 (M = Cout, K = Cin, N = 64 * H * W). Both report GFLOP/s-equivalent (2 M N K per call); the
// context line names the CPU and the int8 path compiled in. Then whole-model inference:
// mobilenetv2-32 at batch 64 in eval mode, fp32 (BatchNorm folded, the same f32 math) against the
// PTQ int8 model (calibrated on two random batches), images/s.
// Run: OMP_NUM_THREADS=1 build/release/bench/bench_int8_gemm --benchmark_min_time=0.3 (one thread: the
// numbers in docs/TECHNIQUES.md; more threads on a shared machine measure the neighbours)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "models/compress/quant_convert.h"
#include "models/mobilenet_v2.h"
#include "core/tensor.h"
#include "ops/cpu_gemm.h"
#include "ops/int8_gemm.h"
#include "ops/quantize.h"

namespace {

mg::Tensor random_f32(int64_t rows, int64_t cols, uint64_t seed, float lo, float hi) {
  mg::Tensor t = mg::empty({rows, cols});
  mg::Generator gen(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = lo + (hi - lo) * gen.uniform_at(uint64_t(i));
  return t;
}

void set_gflops(benchmark::State& state, int64_t M, int64_t N, int64_t K) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(M) * double(N) * double(K) * 1e-9 *
                                                     double(state.iterations()), benchmark::Counter::kIsRate);
}

// args: M, N, K. C(M, N) = W(M, K) X(K, N), X row-major: a pointwise conv's (Cout, Cin) x (Cin, pixels).
void BM_F32Gemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  mg::Tensor w = random_f32(M, K, 1, -1, 1), x = random_f32(K, N, 2, 0, 6), c = mg::zeros({M, N});
  for (auto _ : state) {
    mg::cpu_gemm(mg::Transpose::no, mg::Transpose::no, M, N, K, 1.f, w.data<float>(), K, x.data<float>(), N, 0.f,
                 c.data<float>(), N);
    benchmark::ClobberMemory();
  }
  set_gflops(state, M, N, K);
}

void BM_Int8Gemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  mg::QuantizedChannels q = mg::quantize_per_channel(random_f32(M, K, 1, -1, 1));
  mg::Tensor x = random_f32(K, N, 2, 0, 6), c = mg::zeros({M, N});
  const mg::Int8PackedA a = mg::int8_pack_a(q.values);
  const mg::ActivationQParams act = mg::choose_qparams_u8(0.f, 6.f);
  mg::Tensor row_scale = mg::empty({M});
  for (int64_t m = 0; m < M; ++m) row_scale.data<float>()[m] = q.scales.data<float>()[m] * act.scale;
  const mg::Int8Layout L{.group = N, .group_stride = 0, .col_stride = 1, .row_stride = N};
  for (auto _ : state) {
    mg::int8_gemm_quantize_b(a, N, x.data<float>(), L, 1.f / act.scale, act.zero_point,
                             {.f32 = c.data<float>(), .layout = L, .row_scale = row_scale.data<float>()});
    benchmark::ClobberMemory();
  }
  set_gflops(state, M, N, K);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {256, 512, 1024}) b->Args({n, n, n});
  // MobileNetV2-32, batch 64: expand 24->144 at 32x32, project 144->24 at 32x32, expand 64->384 at 4x4... (M, N, K)
  b->Args({144, 64 * 32 * 32, 24});
  b->Args({24, 64 * 32 * 32, 144});
  b->Args({192, 64 * 16 * 16, 32});
  b->Args({384, 64 * 8 * 8, 64});
  b->Args({960, 64 * 4 * 4, 160});
  b->Args({1280, 64 * 4 * 4, 320});
  b->Unit(benchmark::kMillisecond)->UseRealTime();  // rates over wall time (the work is on OpenMP threads)
}

BENCHMARK(BM_F32Gemm)->Apply(shapes);
BENCHMARK(BM_Int8Gemm)->Apply(shapes);

// arg 0: fp32 with BatchNorm folded; 1: int8 PTQ (minmax observer).
void BM_MobileNetV2_32(benchmark::State& state) {
  mg::NoGradGuard ng;
  mg::Generator g(1);
  auto net = std::make_shared<mg::MobileNetV2>(mg::MobileNetV2Config::named("mobilenetv2-32"), mg::InitOptions{.gen = &g});
  net->eval();
  mg::fold_batch_norms(*net);
  if (state.range(0) == 1) {
    mg::prepare_ptq(*net, {});
    for (uint64_t s : {7, 8}) (*net)(random_f32(64 * 3, 32 * 32, s, -1, 1).as_strided({64, 3, 32, 32}, {3072, 1024, 32, 1}, 0));
    mg::convert_ptq(*net);
  }
  mg::Tensor x = random_f32(64 * 3, 32 * 32, 3, -1, 1).as_strided({64, 3, 32, 32}, {3072, 1024, 32, 1}, 0);
  for (auto _ : state) {
    mg::Tensor y = (*net)(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.counters["images/s"] = benchmark::Counter(64.0 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["weight_bytes"] = double(mg::weight_bytes(*net));
  state.SetLabel(state.range(0) == 1 ? "int8" : "fp32");
}
BENCHMARK(BM_MobileNetV2_32)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("cpu", cpu_model());
  benchmark::AddCustomContext("int8_path", mg::int8_gemm_path());
  benchmark::AddCustomContext("f32_gemm", mg::cpu_gemm_backend());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
