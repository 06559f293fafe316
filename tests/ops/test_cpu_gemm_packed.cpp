// memgrad's packed f32 GEMM (ops/cpu_gemm_packed.h) against Eigen's, bit for bit, with every
// micro-kernel this CPU runs (AVX-512, AVX2, scalar): all four transpose layouts, tails of every
// register tile and of Eigen's blocks, 1-row and 1-column products, padded leading dimensions,
// alpha != 1, beta in {0, 1, other}, and C full of NaN where beta = 0 says it is not read.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu_gemm.h"
#include "ops/cpu_gemm_packed.h"

using namespace mg;

namespace {

// Restores the GEMM kernel a test switched.
struct KernelGuard {
  GemmKernel saved = cpu_gemm_kernel();
  ~KernelGuard() { set_cpu_gemm_kernel(saved); }
};

std::vector<GemmKernel> packed_kernels() {
  std::vector<GemmKernel> ks;
  for (GemmKernel k : {GemmKernel::scalar, GemmKernel::avx2, GemmKernel::avx512})
    if (cpu_gemm_kernel_supported(k)) ks.push_back(k);
  return ks;
}

struct Case {
  int64_t M, N, K;
  Transpose ta, tb;
  float alpha, beta;
  int64_t pad = 0;  // added to every leading dimension
};

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// C from cpu_gemm with kernel k; C starts as `c0` (NaN everywhere when beta is 0).
std::vector<float> run(GemmKernel k, const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                       const std::vector<float>& c0) {
  set_cpu_gemm_kernel(k);
  const int64_t lda = (c.ta == Transpose::no ? c.K : c.M) + c.pad, ldb = (c.tb == Transpose::no ? c.N : c.K) + c.pad;
  const int64_t ldc = c.N + c.pad;
  std::vector<float> out = c0;
  cpu_gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, a.data(), lda, b.data(), ldb, c.beta, out.data(), ldc);
  return out;
}

// Whether two runs agree bit for bit on C's elements (padding columns are not compared).
void check_same_bits(const Case& c, const std::vector<float>& want, const std::vector<float>& got) {
  const int64_t ldc = c.N + c.pad;
  int64_t bad = 0, first_i = -1, first_j = -1;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j)
      if (std::memcmp(&want[i * ldc + j], &got[i * ldc + j], sizeof(float)) != 0 && bad++ == 0)
        first_i = i, first_j = j;
  INFO("differing elements: " << bad << ", first at (" << first_i << ", " << first_j << "): "
                              << (bad ? want[first_i * ldc + first_j] : 0.0f) << " vs "
                              << (bad ? got[first_i * ldc + first_j] : 0.0f));
  CHECK(bad == 0);
}

void check_case(const Case& c, std::mt19937& rng) {
  const int64_t lda = (c.ta == Transpose::no ? c.K : c.M) + c.pad, ldb = (c.tb == Transpose::no ? c.N : c.K) + c.pad;
  const int64_t a_rows = c.ta == Transpose::no ? c.M : c.K, b_rows = c.tb == Transpose::no ? c.K : c.N;
  const std::vector<float> a = random_floats(size_t(a_rows * lda), rng), b = random_floats(size_t(b_rows * ldb), rng);
  std::vector<float> c0 = random_floats(size_t(c.M * (c.N + c.pad)), rng);
  if (c.beta == 0.0f) std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> want = run(GemmKernel::eigen, c, a, b, c0);
  for (GemmKernel k : packed_kernels()) {
    INFO("kernel " << gemm_kernel_name(k) << ", M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << int(c.ta)
                   << " tb=" << int(c.tb) << " alpha=" << c.alpha << " beta=" << c.beta << " pad=" << c.pad);
    check_same_bits(c, want, run(k, c, a, b, c0));
  }
}

}  // namespace

TEST_CASE("packed GEMM gives Eigen's bits on shapes that reach every summation path", "[cpu_gemm]") {
  KernelGuard guard;
  std::mt19937 rng(7);
  // N decides the paths (Note [Eigen's summation order]): 3P/2P panels, P/half/quarter panels, the
  // swapped columns (N % 4); M the register-row tails and the nc-block tails; K the kc blocks and
  // the even/odd peeling (K % 8).
  const int64_t ns[] = {2, 3, 5, 16, 19, 28, 47, 48, 61, 64, 77, 100, 131};
  const int64_t ms[] = {2, 3, 7, 13, 25, 66};
  const int64_t kss[] = {1, 5, 8, 17, 64, 130};
  int i = 0;
  for (int64_t N : ns)
    for (int64_t M : ms)
      for (int64_t K : kss) {
        const Transpose ta = Transpose((i >> 0) & 1), tb = Transpose((i >> 1) & 1);
        const float beta = (i % 3 == 0) ? 0.0f : (i % 3 == 1) ? 1.0f : 0.5f;
        const float alpha = (i % 5 == 0) ? 0.37f : 1.0f;
        check_case({M, N, K, ta, tb, alpha, beta, int64_t(i % 4 == 3 ? 3 : 0)}, rng);
        ++i;
      }
}

TEST_CASE("packed GEMM gives Eigen's bits on large products, tiled and threaded", "[cpu_gemm]") {
  KernelGuard guard;
  std::mt19937 rng(11);
  const int saved = num_threads();
  // Threads take runs of tiles and share packed rows and columns across them: 3 threads cut the
  // grid's rows between runs.
  const int threads = GENERATE(1, 2, 3);
  set_num_threads(threads);
  INFO("threads " << threads);
  const Case cases[] = {
      {512, 384, 512, Transpose::no, Transpose::yes, 1.0f, 0.0f},     // linear forward
      {2048, 1536, 96, Transpose::no, Transpose::yes, 1.0f, 1.0f},    // a 4 x 4 grid of 512 x 384 tiles
      {1000, 700, 200, Transpose::yes, Transpose::no, 0.5f, 0.25f},   // a grid with edge tiles
      {300, 1030, 260, Transpose::no, Transpose::no, 1.0f, 1.0f, 1},  // linear's bias (beta 1), many mc blocks
      {258, 130, 2050, Transpose::yes, Transpose::no, 1.0f, 0.0f},    // a weight gradient: several kc blocks
      {1030, 70, 300, Transpose::yes, Transpose::yes, 0.125f, 0.5f},  // several nc blocks with row tails
      {64, 64, 64, Transpose::no, Transpose::yes, 0.125f, 0.0f},      // attention scores
      {1, 700, 300, Transpose::no, Transpose::no, 1.0f, 0.0f},        // Eigen's GEMV: taken by Eigen
      {700, 1, 300, Transpose::no, Transpose::yes, 1.0f, 1.0f},
      {3, 4, 5, Transpose::no, Transpose::no, 1.0f, 0.0f},            // Eigen's coefficient-wise product
  };
  for (const Case& c : cases) check_case(c, rng);
  set_num_threads(saved);
}

TEST_CASE("packed GEMM gives Eigen's bits on random shapes", "[cpu_gemm]") {
  KernelGuard guard;
  std::mt19937 rng(13);
  std::uniform_int_distribution<int64_t> side(1, 150), depth(1, 300), coin(0, 1), pad(0, 5);
  for (int t = 0; t < 40; ++t) {
    const int64_t r = coin(rng) + 2 * coin(rng);
    const float beta = r == 0 ? 0.0f : r == 1 ? 1.0f : r == 2 ? -0.75f : 0.0f;
    check_case({side(rng), side(rng), depth(rng), Transpose(coin(rng)), Transpose(coin(rng)),
                coin(rng) ? 1.0f : 1.5f, beta, pad(rng)},
               rng);
  }
}

TEST_CASE("the converting 16-bit GEMM gives the same bits with every f32 kernel", "[cpu_gemm]") {
  // f16 always converts to f32 panels; bf16 does with every kernel but AVX-512 (which takes
  // vdpbf16ps where the CPU has it: tests/ops/test_cpu_gemm_bf16.cpp).
  KernelGuard guard;
  std::mt19937 rng(17);
  const int64_t M = 70, N = 90, K = 150;
  auto run = [&](auto zero, std::vector<GemmKernel> kernels) {
    using H = decltype(zero);
    std::vector<H> a(M * K), b(K * N);
    for (auto* v : {&a, &b})
      for (H& x : *v) x = H(std::uniform_real_distribution<float>(-1, 1)(rng));
    std::vector<float> ws(size_t(cpu_gemm_workspace_floats(M, N, K)));
    std::vector<std::vector<H>> outs;
    for (GemmKernel k : kernels) {
      if (!cpu_gemm_kernel_supported(k)) continue;
      set_cpu_gemm_kernel(k);
      std::vector<H> c(M * N);
      cpu_gemm(Transpose::no, Transpose::yes, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N, ws.data());
      outs.push_back(c);
    }
    for (size_t i = 1; i < outs.size(); ++i) CHECK(std::memcmp(outs[0].data(), outs[i].data(), M * N * 2) == 0);
  };
  run(Half(0.0f), {GemmKernel::eigen, GemmKernel::scalar, GemmKernel::avx2, GemmKernel::avx512});
  run(BFloat16(0.0f), {GemmKernel::eigen, GemmKernel::scalar, GemmKernel::avx2});
}

TEST_CASE("the converting 16-bit GEMM is the f32 GEMM of the converted operands, rounded", "[cpu_gemm]") {
  // Tiled shapes: the whole product converted once when its copies fit the workspace, else tile by
  // tile: either way each element has the bits of the f32 grid's.
  KernelGuard guard;
  set_cpu_gemm_kernel(GemmKernel::avx2);  // bf16 converts with every kernel but AVX-512's
  if (!cpu_gemm_kernel_supported(GemmKernel::avx2)) set_cpu_gemm_kernel(GemmKernel::scalar);
  const int saved_threads = num_threads();
  std::mt19937 rng(23);
  struct Shape {
    int64_t M, N, K;
  };
  auto run = [&](auto zero, Shape s, Transpose ta, Transpose tb, float beta) {
    using H = decltype(zero);
    const int64_t lda = (ta == Transpose::no ? s.K : s.M) + 3, ldb = (tb == Transpose::no ? s.N : s.K) + 1;
    const int64_t ldc = s.N + 2;
    std::vector<H> a((ta == Transpose::no ? s.M : s.K) * lda), b((tb == Transpose::no ? s.K : s.N) * ldb), c0(s.M * ldc);
    for (auto* v : {&a, &b, &c0})
      for (H& x : *v) x = H(std::uniform_real_distribution<float>(-1, 1)(rng));
    auto f32 = [](const std::vector<H>& v) {
      std::vector<float> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
      return out;
    };
    std::vector<float> a32 = f32(a), b32 = f32(b), want32 = f32(c0);
    cpu_gemm(ta, tb, s.M, s.N, s.K, 1.25f, a32.data(), lda, b32.data(), ldb, beta, want32.data(), ldc);
    std::vector<float> ws(size_t(cpu_gemm_workspace_floats(s.M, s.N, s.K)));
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<H> c = c0;
      cpu_gemm(ta, tb, s.M, s.N, s.K, 1.25f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, ws.data());
      int64_t differ = 0;
      for (int64_t i = 0; i < s.M; ++i)
        for (int64_t j = 0; j < s.N; ++j) {
          const H want = H(want32[i * ldc + j]);
          differ += std::memcmp(&want, &c[i * ldc + j], sizeof(H)) != 0;
        }
      INFO("M " << s.M << " N " << s.N << " K " << s.K << " beta " << beta << " threads " << threads);
      CHECK(differ == 0);
    }
  };
  for (Shape s : {Shape{300, 260, 200}, Shape{1024, 1024, 24}, Shape{40, 700, 90}})
    for (Transpose ta : {Transpose::no, Transpose::yes})
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        const float beta = ta == tb ? 0.0f : 0.5f;
        run(BFloat16(0.0f), s, ta, tb, beta);
        run(Half(0.0f), s, ta, tb, beta);
      }
  // 4 x 4 tiles on 8 lanes hold less than the whole product's copies here: the tile-by-tile path.
  run(BFloat16(0.0f), Shape{2048, 2048, 128}, Transpose::no, Transpose::yes, 0.5f);
  set_num_threads(saved_threads);
}

TEST_CASE("GEMM kernel selection names the kernels and refuses what the CPU lacks", "[cpu_gemm]") {
  KernelGuard guard;
  CHECK(std::string(gemm_kernel_name(GemmKernel::avx512)) == "avx512");
  CHECK(cpu_gemm_kernel_supported(GemmKernel::scalar));
  CHECK(cpu_gemm_kernel_supported(GemmKernel::eigen));
  set_cpu_gemm_kernel(GemmKernel::scalar);
  CHECK(cpu_gemm_kernel() == GemmKernel::scalar);
  CHECK(std::string(cpu_gemm_backend()).find("scalar") != std::string::npos);
  for (GemmKernel k : {GemmKernel::avx2, GemmKernel::avx512})
    if (!cpu_gemm_kernel_supported(k))
      CHECK_THROWS_WITH(set_cpu_gemm_kernel(k), Catch::Contains("this CPU does not run"));
#if defined(__FMA__)
  // With FMA, Eigen's order is the one emulated: the packed GEMM takes every product but the
  // GEMV and coefficient-wise ones (the bit-for-bit tests above compare it, not Eigen with itself).
  CHECK(gemm_packed::handles(64, 64, 64));
  CHECK(gemm_packed::handles(2, 2, 16));
  CHECK_FALSE(gemm_packed::handles(1, 64, 64));
  CHECK_FALSE(gemm_packed::handles(64, 1, 64));
  CHECK_FALSE(gemm_packed::handles(5, 5, 5));
#endif
}

TEST_CASE("cpu_gemm_bias gives the bits of filling C with the bias and adding onto it", "[cpu_gemm]") {
  KernelGuard guard;
  std::mt19937 rng(23);
  const int saved = num_threads();
  set_num_threads(2);
  struct Shape3 {
    int64_t M, N, K;
    Transpose ta, tb;
  };
  const Shape3 shapes[] = {{512, 384, 512, Transpose::no, Transpose::yes},
                           {70, 131, 300, Transpose::no, Transpose::yes},
                           {33, 61, 17, Transpose::yes, Transpose::no},    {1, 300, 40, Transpose::no, Transpose::no},
                           {5, 3, 2, Transpose::no, Transpose::yes},       {9, 26, 0, Transpose::no, Transpose::no}};
  for (const Shape3& s : shapes) {
    const int64_t lda = s.ta == Transpose::no ? s.K : s.M, ldb = s.tb == Transpose::no ? s.N : s.K;
    const std::vector<float> a = random_floats(size_t((s.ta == Transpose::no ? s.M : s.K) * lda) + 1, rng);
    const std::vector<float> b = random_floats(size_t((s.tb == Transpose::no ? s.K : s.N) * ldb) + 1, rng);
    const std::vector<float> bias = random_floats(size_t(s.N), rng);
    for (GemmKernel k : {GemmKernel::eigen, GemmKernel::scalar, GemmKernel::avx2, GemmKernel::avx512}) {
      if (!cpu_gemm_kernel_supported(k)) continue;
      INFO("kernel " << gemm_kernel_name(k) << " M=" << s.M << " N=" << s.N << " K=" << s.K);
      set_cpu_gemm_kernel(GemmKernel::eigen);  // the reference: rows filled, then beta = 1
      std::vector<float> want(size_t(s.M * s.N));
      for (int64_t i = 0; i < s.M; ++i) std::copy(bias.begin(), bias.end(), want.begin() + i * s.N);
      cpu_gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), std::max<int64_t>(lda, 1), b.data(),
               std::max<int64_t>(ldb, 1), 1.0f, want.data(), s.N);
      set_cpu_gemm_kernel(k);
      std::vector<float> got(size_t(s.M * s.N), std::numeric_limits<float>::quiet_NaN());  // C is not read
      cpu_gemm_bias(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), std::max<int64_t>(lda, 1), b.data(),
                    std::max<int64_t>(ldb, 1), bias.data(), got.data(), s.N);
      CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
    }
  }
  set_num_threads(saved);
}
