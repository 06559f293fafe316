// f32 GEMM C = A * B (row-major, n x n) at n = 512, 1024, 2048: the baselines memgrad's own
// matmul is measured against. Each backend is one BENCHMARK over the same inputs (mg::empty
// tensors, so the buffers come from the caching allocator, filled with uniform [-1, 1) values)
// and reports GFLOP/s (2 n^3 flops per call) as a rate counter.
// Run: OMP_NUM_THREADS=2 build/release/bench/bench_gemm --benchmark_min_time=0.2
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

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;

// A, B random and C zeroed, each (n, n) f32 on cpu:0.
struct GemmOperands {
  explicit GemmOperands(int64_t n) : n(n), a(random(n, 1)), b(random(n, 2)), c(mg::zeros({n, n})) {}
  static mg::Tensor random(int64_t n, uint64_t seed) {
    mg::Tensor t = mg::empty({n, n});
    mg::Generator gen(seed);
    float* p = t.data<float>();
    for (int64_t i = 0; i < n * n; ++i) p[i] = 2.0f * gen.uniform_at(uint64_t(i)) - 1.0f;
    return t;
  }
  int64_t n;
  mg::Tensor a, b, c;
};

void set_gflops(benchmark::State& state, int64_t n) {
  double flops_per_call = 2.0 * double(n) * double(n) * double(n);
  // kIsRate divides by the measured time, so the counter reads GFLOP/s ("GFLOP=.../s").
  state.counters["GFLOP"] = benchmark::Counter(flops_per_call * 1e-9 * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

// (a) Eigen's GEMM over Eigen::Map views of the tensors' memory (no copies, no temporary).
void BM_GemmEigen(benchmark::State& state) {
  const int64_t n = state.range(0);
  GemmOperands m(n);
  MatrixMap a(m.a.data<float>(), n, n), b(m.b.data<float>(), n, n), c(m.c.data<float>(), n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// (b) OpenBLAS (OpenMP build, so it shares the thread count set by OMP_NUM_THREADS).
void BM_GemmOpenBLAS(benchmark::State& state) {
  const int64_t n = state.range(0);
  GemmOperands m(n);
  const blasint ni = blasint(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, m.a.data<float>(), ni,
                m.b.data<float>(), ni, 0.0f, m.c.data<float>(), ni);
    benchmark::DoNotOptimize(m.c.data<float>());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

}  // namespace

BENCHMARK(BM_GemmEigen)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmOpenBLAS)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
