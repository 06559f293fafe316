// bf16 products on vdpbf16ps (ops/cpu_gemm_bf16.cpp), where the CPU has AVX512-BF16: against an
// f64 reference within one bf16 rounding of the result, for odd K (a half-empty last pair), row and
// column tails, every transpose layout, alpha and beta; the same bits on 1 and 2 threads; and close
// to the converting path. Skipped (visibly) on CPUs without AVX512-BF16.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu_gemm.h"
#include "ops/cpu_gemm_packed.h"

using namespace mg;

namespace {

struct Case {
  int64_t M, N, K;
  Transpose ta, tb;
  float alpha, beta;
};

// C after cpu_gemm on bf16 operands drawn from rng (C starts at c0 values).
std::vector<BFloat16> run(const Case& c, const std::vector<BFloat16>& a, const std::vector<BFloat16>& b,
                          std::vector<BFloat16> out) {
  std::vector<float> ws(size_t(cpu_gemm_workspace_floats(c.M, c.N, c.K)) + 1);
  const int64_t lda = c.ta == Transpose::no ? c.K : c.M, ldb = c.tb == Transpose::no ? c.N : c.K;
  cpu_gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, a.data(), lda, b.data(), ldb, c.beta, out.data(), c.N, ws.data());
  return out;
}

}  // namespace

TEST_CASE("bf16 GEMM on vdpbf16ps matches an f64 reference", "[cpu_gemm]") {
  if (!gemm_packed::bf16_pairs_supported() || !cpu_gemm_kernel_supported(GemmKernel::avx512)) {
    WARN("skipped: this CPU has no AVX512-BF16");
    return;
  }
  const GemmKernel saved = cpu_gemm_kernel();
  const int saved_threads = num_threads();
  const bool saved_dot = cpu_gemm_bf16_dot();
  set_cpu_gemm_kernel(GemmKernel::avx512);
  set_cpu_gemm_bf16_dot(true);  // whatever this CPU's default (Note [bf16 dot by vendor])
  CHECK(std::string(cpu_gemm_backend()).find("vdpbf16ps") != std::string::npos);
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const Case cases[] = {{37, 45, 1, Transpose::no, Transpose::no, 1.0f, 0.0f},
                        {13, 33, 7, Transpose::yes, Transpose::no, 0.5f, 1.0f},
                        {64, 64, 64, Transpose::no, Transpose::yes, 1.0f, 0.0f},
                        {100, 70, 129, Transpose::yes, Transpose::yes, 1.0f, -0.5f},
                        {300, 260, 515, Transpose::no, Transpose::yes, 1.0f, 0.0f},   // tiled
                        {2, 2, 3000, Transpose::no, Transpose::no, 2.0f, 0.0f}};
  for (const Case& c : cases) {
    INFO("M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << int(c.ta) << " tb=" << int(c.tb));
    std::vector<BFloat16> a(size_t(c.M * c.K)), b(size_t(c.K * c.N)), c0(size_t(c.M * c.N));
    for (auto* v : {&a, &b, &c0})
      for (BFloat16& x : *v) x = BFloat16(u(rng));
    set_num_threads(1);
    const std::vector<BFloat16> one = run(c, a, b, c0);
    set_num_threads(2);
    const std::vector<BFloat16> two = run(c, a, b, c0);
    CHECK(std::memcmp(one.data(), two.data(), one.size() * 2) == 0);
    const int64_t lda = c.ta == Transpose::no ? c.K : c.M, ldb = c.tb == Transpose::no ? c.N : c.K;
    double worst = 0;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < c.K; ++k)
          acc += double(float(c.ta == Transpose::no ? a[size_t(i * lda + k)] : a[size_t(k * lda + i)])) *
                 double(float(c.tb == Transpose::no ? b[size_t(k * ldb + j)] : b[size_t(j * ldb + k)]));
        const double ref = c.alpha * acc + c.beta * double(float(c0[size_t(i * c.N + j)]));
        worst = std::max(worst, std::abs(double(float(one[size_t(i * c.N + j)])) - ref) / (1.0 + std::abs(ref)));
      }
    CHECK(worst <= 1.0 / 128);  // one rounding of the result to bf16; the f32 sum's error is far below
    // The converting path (f32 panels, Eigen's order) lands within a bf16 ulp or two of it.
    set_cpu_gemm_kernel(GemmKernel::avx2);
    const std::vector<BFloat16> conv = run(c, a, b, c0);
    set_cpu_gemm_kernel(GemmKernel::avx512);
    double apart = 0;
    for (size_t i = 0; i < one.size(); ++i)
      apart = std::max(apart, std::abs(double(float(one[i])) - double(float(conv[i]))) /
                                  (1.0 + std::abs(double(float(conv[i])))));
    CHECK(apart <= 2.0 / 128);
  }
  set_num_threads(saved_threads);
  set_cpu_gemm_kernel(saved);
  set_cpu_gemm_bf16_dot(saved_dot);
}

TEST_CASE("bf16 GEMM: the vdpbf16ps switch picks the path memgrad info names, and the converting path when off",
          "[cpu_gemm]") {
  const bool saved_dot = cpu_gemm_bf16_dot();
  const GemmKernel saved = cpu_gemm_kernel();
  if (!gemm_packed::bf16_pairs_supported()) {
    CHECK_FALSE(saved_dot);
    CHECK_THROWS_WITH(set_cpu_gemm_bf16_dot(true), Catch::Matchers::Contains("no AVX512-BF16"));
    return;
  }
#if defined(__x86_64__)
  const char* env = std::getenv("MG_BF16_DOT");
  if (env == nullptr || *env == '\0') CHECK(saved_dot == __builtin_cpu_is("amd"));  // the vendor's default
#endif
  if (!cpu_gemm_kernel_supported(GemmKernel::avx512)) return;
  set_cpu_gemm_kernel(GemmKernel::avx512);
  gemm_packed::set_amx_bf16_allowed(false);  // AMX, where the CPU has it, comes before either path
  set_cpu_gemm_bf16_dot(false);
  CHECK(std::string(cpu_gemm_backend()).find("converted to f32") != std::string::npos);
  // Off, a bf16 product has the bits of the f32 product of the converted operands, rounded once.
  const int64_t M = 70, N = 90, K = 130;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<BFloat16> a(size_t(M * K)), b(size_t(K * N)), c(size_t(M * N));
  std::vector<float> af(a.size()), bf(b.size()), cf(c.size());
  for (size_t i = 0; i < a.size(); ++i) af[i] = float(a[i] = BFloat16(u(rng)));
  for (size_t i = 0; i < b.size(); ++i) bf[i] = float(b[i] = BFloat16(u(rng)));
  std::vector<float> ws(size_t(cpu_gemm_workspace_floats(M, N, K)));
  cpu_gemm(Transpose::no, Transpose::no, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N, ws.data());
  cpu_gemm(Transpose::no, Transpose::no, M, N, K, 1.0f, af.data(), K, bf.data(), N, 0.0f, cf.data(), N);
  size_t same = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const BFloat16 want(cf[i]);
    same += std::memcmp(&c[i], &want, sizeof want) == 0;
  }
  CHECK(same == c.size());
  set_cpu_gemm_bf16_dot(true);
  CHECK(std::string(cpu_gemm_backend()).find("vdpbf16ps") != std::string::npos);
  set_cpu_gemm_bf16_dot(saved_dot);
  gemm_packed::set_amx_bf16_allowed(true);
  set_cpu_gemm_kernel(saved);
}
