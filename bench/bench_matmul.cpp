// f32 C = A * B (row-major, n x n) at n = 512, 1024, 2048 through (a) mg::matmul, (b) Eigen's
// GEMM called directly and (c) cblas_sgemm called directly: how much memgrad's dispatch costs over
// the library it calls (cpu_gemm), and whether Eigen would be the faster library to call.
// (d) BM_GemmKernel: cpu_gemm on the GPT workloads' products with each f32 kernel (eigen = the
// GEMM memgrad used before its packed one), single-threaded (GFLOP/s per core, from CPU time, so
// a busy machine disturbs it less) and on 2 threads (wall time).
// (e) BM_GemmBf16: the same products with bf16 operands and result, on the avx512 kernel, with
// each 16-bit path: tiles converted to f32 (dot 0) or vdpbf16ps (dot 1), which is faster depends
// on the CPU (ops/cpu_gemm.cpp, Note [bf16 dot by vendor]); f32's row of (d) is the yardstick.
// (f) BM_InstructionPeak: one core's rate of vfmadd231ps and vdpbf16ps (zmm, 24 independent
// accumulators, no memory traffic), the ceiling each 16-bit path's kernel can reach.
// Each reports GFLOP/s (2 M N K flops per call) as a rate counter.
// Run: OMP_NUM_THREADS=2 build/<dir>/bench/bench_matmul --benchmark_min_time=0.5
#include <benchmark/benchmark.h>
#include <cblas.h>

// GCC 12 warns about _mm512_undefined_ps() inside its own AVX-512 intrinsics once Eigen's GEMM
// kernel is inlined here (GCC bug 105593, fixed in GCC 13): a false positive, not our code.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cpu_gemm.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;

// (n, n) f32 on cpu:0, uniform in [-1, 1) from a fixed seed.
mg::Tensor random_matrix(int64_t n, uint64_t seed) {
  mg::Tensor t = mg::empty({n, n});
  mg::Generator gen(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n * n; ++i) p[i] = 2.0f * gen.uniform_at(uint64_t(i)) - 1.0f;
  return t;
}

void set_gflops(benchmark::State& state, int64_t n) {
  const double flops_per_call = 2.0 * double(n) * double(n) * double(n);
  // kIsRate divides by the measured time, so the counter reads GFLOP/s.
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_call * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
}

// (a) memgrad: checks, allocation of C from the caching allocator (a cached block after the
// first call), then cpu_gemm.
void BM_MatmulMemgrad(benchmark::State& state) {
  const int64_t n = state.range(0);
  mg::Tensor a = random_matrix(n, 1), b = random_matrix(n, 2);
  for (auto _ : state) {
    mg::Tensor c = mg::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// (b) Eigen's GEMM over Eigen::Map views of the same kind of buffers (no copies, no temporary).
void BM_MatmulEigen(benchmark::State& state) {
  const int64_t n = state.range(0);
  mg::Tensor ta = random_matrix(n, 1), tb = random_matrix(n, 2), tc = mg::zeros({n, n});
  MatrixMap a(ta.data<float>(), n, n), b(tb.data<float>(), n, n), c(tc.data<float>(), n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// (c) OpenBLAS's cblas_sgemm (OpenMP build: it uses OMP_NUM_THREADS threads).
void BM_MatmulOpenBLAS(benchmark::State& state) {
  const int64_t n = state.range(0);
  mg::Tensor a = random_matrix(n, 1), b = random_matrix(n, 2), c = mg::zeros({n, n});
  const blasint ni = blasint(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a.data<float>(), ni, b.data<float>(), ni,
                0.0f, c.data<float>(), ni);
    benchmark::DoNotOptimize(c.data<float>());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// (d) The products of one gpt-small step (B*T = 2048 rows, C = 512): linear forward
// x (2048, C) w^T, its input gradient dy (2048, out) w, its weight gradient dy^T x, and an attention
// tile (64 x 64 x 64, q k^T). Arguments: shape index, kernel, threads.
struct GemmShape {
  const char* name;
  int64_t M, N, K;
  mg::Transpose ta, tb;
};
const GemmShape kShapes[] = {
    {"qkv_fwd 2048x1536x512 NT", 2048, 1536, 512, mg::Transpose::no, mg::Transpose::yes},
    {"fc_fwd 2048x2048x512 NT", 2048, 2048, 512, mg::Transpose::no, mg::Transpose::yes},
    {"proj_fwd 2048x512x2048 NT", 2048, 512, 2048, mg::Transpose::no, mg::Transpose::yes},
    {"fc_dx 2048x512x2048 NN", 2048, 512, 2048, mg::Transpose::no, mg::Transpose::no},
    {"fc_dw 2048x512x2048 TN", 2048, 512, 2048, mg::Transpose::yes, mg::Transpose::no},
    {"attn_qk 64x64x64 NT", 64, 64, 64, mg::Transpose::no, mg::Transpose::yes},
};

void BM_GemmKernel(benchmark::State& state) {
  const GemmShape& s = kShapes[state.range(0)];
  const auto kernel = mg::GemmKernel(state.range(1));
  const int threads = int(state.range(2));
  if (!mg::cpu_gemm_kernel_supported(kernel)) {
    state.SkipWithError("this CPU does not run the kernel");
    return;
  }
  const mg::GemmKernel saved = mg::cpu_gemm_kernel();
  const int saved_threads = mg::num_threads();
  mg::set_cpu_gemm_kernel(kernel);
  mg::set_num_threads(threads);
  mg::Tensor a = random_matrix(std::max(s.M, s.K), 1), b = random_matrix(std::max(s.K, s.N), 2);
  mg::Tensor c = mg::zeros({s.M, s.N});
  const int64_t lda = a.size(1), ldb = b.size(1);
  for (auto _ : state) {
    mg::cpu_gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data<float>(), lda, b.data<float>(), ldb, 0.0f, c.data<float>(),
                 s.N);
    benchmark::DoNotOptimize(c.data<float>());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(s.M) * double(s.N) * double(s.K) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.SetLabel(std::string(s.name) + " " + mg::gemm_kernel_name(kernel) + " " + std::to_string(threads) + "t");
  mg::set_cpu_gemm_kernel(saved);
  mg::set_num_threads(saved_threads);
}

void BM_GemmBf16(benchmark::State& state) {
  const GemmShape& s = kShapes[state.range(0)];
  const bool dot = state.range(1) != 0;
  const int threads = int(state.range(2));
  if (!mg::cpu_gemm_kernel_supported(mg::GemmKernel::avx512) || (dot && !mg::cpu_gemm_bf16_dot_supported())) {
    state.SkipWithError("this CPU has no AVX-512 (or no AVX512-BF16 for the dot)");
    return;
  }
  const mg::GemmKernel saved = mg::cpu_gemm_kernel();
  const bool saved_dot = mg::cpu_gemm_bf16_dot();
  const int saved_threads = mg::num_threads();
  mg::set_cpu_gemm_kernel(mg::GemmKernel::avx512);
  mg::set_cpu_gemm_bf16_dot(dot);
  mg::set_num_threads(threads);
  const int64_t ra = std::max(s.M, s.K), rb = std::max(s.K, s.N);
  mg::Tensor a = mg::cast(random_matrix(ra, 1), mg::DType::bf16), b = mg::cast(random_matrix(rb, 2), mg::DType::bf16);
  mg::Tensor c = mg::zeros({s.M, s.N}, {.dtype = mg::DType::bf16});
  std::vector<float> ws(size_t(mg::cpu_gemm_workspace_floats(s.M, s.N, s.K)));
  for (auto _ : state) {
    mg::cpu_gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data<mg::BFloat16>(), ra, b.data<mg::BFloat16>(), rb, 0.0f,
                 c.data<mg::BFloat16>(), s.N, ws.data());
    benchmark::DoNotOptimize(c.data<mg::BFloat16>());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(s.M) * double(s.N) * double(s.K) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.SetLabel(std::string(s.name) + (dot ? " bf16 vdpbf16ps " : " bf16 converted ") + std::to_string(threads) + "t");
  mg::set_cpu_gemm_kernel(saved);
  mg::set_cpu_gemm_bf16_dot(saved_dot);
  mg::set_num_threads(saved_threads);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_loop(int64_t n) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  __m512 a = _mm512_set1_ps(1.0001f);
  const __m512 b = _mm512_set1_ps(0.9999f);
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));  // one opaque value per round: the loop is not folded
  }
  for (int i = 1; i < 24; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  return lanes[0];
}
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(int64_t n) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  for (int i = 1; i < 24; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  return lanes[0];
}

// Argument 0: vfmadd231ps (32 flops per instruction), 1: vdpbf16ps (64).
void BM_InstructionPeak(benchmark::State& state) {
  const bool dot = state.range(0) != 0;
  if (!__builtin_cpu_supports("avx512f") || (dot && !mg::cpu_gemm_bf16_dot_supported())) {
    state.SkipWithError("this CPU has no AVX-512 (or no AVX512-BF16)");
    return;
  }
  const int64_t rounds = 1 << 20;
  for (auto _ : state) benchmark::DoNotOptimize(dot ? dpbf16_loop(rounds) : fma_loop(rounds));
  state.counters["GFLOP/s"] = benchmark::Counter(1e-9 * 24.0 * (dot ? 64.0 : 32.0) * double(rounds) *
                                                 double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(dot ? "vdpbf16ps zmm" : "vfmadd231ps zmm");
}
BENCHMARK(BM_InstructionPeak)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
#endif

template <int64_t Threads>
void gemm_bf16_args(benchmark::internal::Benchmark* b) {
  for (int64_t shape = 0; shape < int64_t(std::size(kShapes)) - 1; ++shape)  // the GPT products
    for (int64_t dot : {0, 1}) b->Args({shape, dot, Threads});
}

template <int64_t Threads>
void gemm_kernel_args(benchmark::internal::Benchmark* b) {
  for (int64_t shape = 0; shape < int64_t(std::size(kShapes)); ++shape)
    for (mg::GemmKernel k : {mg::GemmKernel::eigen, mg::GemmKernel::avx2, mg::GemmKernel::avx512})
      b->Args({shape, int64_t(k), Threads});
}

}  // namespace

// One thread: rates from the thread's CPU time. Two threads: from wall time.
BENCHMARK(BM_GemmKernel)->Apply(gemm_kernel_args<1>)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmKernel)->Apply(gemm_kernel_args<2>)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmBf16)->Apply(gemm_bf16_args<1>)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmBf16)->Apply(gemm_bf16_args<2>)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MatmulMemgrad)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MatmulEigen)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MatmulOpenBLAS)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
