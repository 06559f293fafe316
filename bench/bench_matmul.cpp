// f32 C = A * B (row-major, n x n) at n = 512, 1024, 2048 through (a) mg::matmul, (b) Eigen's
// GEMM called directly and (c) cblas_sgemm called directly: how much memgrad's dispatch costs over
// the library it calls (cpu_gemm), and whether Eigen would be the faster library to call.
// Each reports GFLOP/s (2 n^3 flops per call) as a rate counter.
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

#include "core/rng.h"
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

}  // namespace

BENCHMARK(BM_MatmulMemgrad)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MatmulEigen)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MatmulOpenBLAS)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
