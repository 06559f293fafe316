// bf16 products on AMX tiles (ops/cpu_gemm_amx.cpp), where the CPU has AMX-BF16: called directly
// and through cpu_gemm, against an f64 reference within one bf16 rounding of the result, for odd K
// (a padded last k step), row and column tails past the 32 x 32 blocks, every transpose layout,
// alpha and beta; the same bits on 1 and 2 threads; and against the vdpbf16ps path. Skipped
// (visibly) on CPUs without AMX.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
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

int64_t lda_of(const Case& c) { return c.ta == Transpose::no ? c.K : c.M; }
int64_t ldb_of(const Case& c) { return c.tb == Transpose::no ? c.N : c.K; }

std::vector<BFloat16> through_cpu_gemm(const Case& c, const std::vector<BFloat16>& a, const std::vector<BFloat16>& b,
                                       std::vector<BFloat16> out) {
  std::vector<float> ws(size_t(cpu_gemm_workspace_floats(c.M, c.N, c.K)) + 1);
  cpu_gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, a.data(), lda_of(c), b.data(), ldb_of(c), c.beta, out.data(), c.N,
           ws.data());
  return out;
}

std::vector<BFloat16> direct(const Case& c, const std::vector<BFloat16>& a, const std::vector<BFloat16>& b,
                             std::vector<BFloat16> out) {
  std::vector<float> ws(size_t(gemm_packed::amx_bf16_workspace_floats(c.M, c.N, c.K)));
  gemm_packed::amx_bf16_gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, a.data(), lda_of(c), b.data(), ldb_of(c), c.beta,
                             out.data(), c.N, ws.data());
  return out;
}

// The largest |x - ref| / (1 + |ref|) over C, ref = alpha op(A) op(B) + beta C0 in f64.
double worst_error(const Case& c, const std::vector<BFloat16>& a, const std::vector<BFloat16>& b,
                   const std::vector<BFloat16>& c0, const std::vector<BFloat16>& x) {
  const int64_t lda = lda_of(c), ldb = ldb_of(c);
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < c.K; ++k)
        acc += double(float(c.ta == Transpose::no ? a[size_t(i * lda + k)] : a[size_t(k * lda + i)])) *
               double(float(c.tb == Transpose::no ? b[size_t(k * ldb + j)] : b[size_t(j * ldb + k)]));
      const double ref = c.alpha * acc + c.beta * double(float(c0[size_t(i * c.N + j)]));
      worst = std::max(worst, std::abs(double(float(x[size_t(i * c.N + j)])) - ref) / (1.0 + std::abs(ref)));
    }
  return worst;
}

double apart(const std::vector<BFloat16>& x, const std::vector<BFloat16>& y) {
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i)
    d = std::max(d, std::abs(double(float(x[i])) - double(float(y[i]))) / (1.0 + std::abs(double(float(y[i])))));
  return d;
}

}  // namespace

TEST_CASE("bf16 GEMM on AMX tiles matches an f64 reference and the vdpbf16ps path", "[cpu_gemm][amx]") {
  if (!gemm_packed::amx_bf16_supported() || !cpu_gemm_kernel_supported(GemmKernel::avx512)) {
    WARN("skipped: this CPU (or OS) offers no AMX-BF16");
    return;
  }
  const GemmKernel saved = cpu_gemm_kernel();
  const int saved_threads = num_threads();
  const bool saved_dot = cpu_gemm_bf16_dot();
  set_cpu_gemm_kernel(GemmKernel::avx512);
  set_cpu_gemm_bf16_dot(true);  // the vdpbf16ps path compared below, whatever this CPU's default
  const char* env = std::getenv("MG_AMX");
  if (env == nullptr || std::strcmp(env, "0") != 0)  // memgrad info names the path cpu_gemm takes
    CHECK(std::string(cpu_gemm_backend()).find("AMX") != std::string::npos);
  std::mt19937 rng(47);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const Case cases[] = {{37, 45, 1, Transpose::no, Transpose::no, 1.0f, 0.0f},
                        {13, 33, 7, Transpose::yes, Transpose::no, 0.5f, 1.0f},
                        {64, 64, 64, Transpose::no, Transpose::yes, 1.0f, 0.0f},
                        {100, 70, 129, Transpose::yes, Transpose::yes, 1.0f, -0.5f},
                        {300, 260, 515, Transpose::no, Transpose::yes, 1.0f, 0.0f},  // tiled
                        {33, 17, 3000, Transpose::no, Transpose::no, 2.0f, 0.0f}};
  for (const Case& c : cases) {
    INFO("M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << int(c.ta) << " tb=" << int(c.tb));
    std::vector<BFloat16> a(size_t(c.M * c.K)), b(size_t(c.K * c.N)), c0(size_t(c.M * c.N));
    for (auto* v : {&a, &b, &c0})
      for (BFloat16& x : *v) x = BFloat16(u(rng));
    const std::vector<BFloat16> own = direct(c, a, b, c0);
    CHECK(worst_error(c, a, b, c0, own) <= 1.0 / 128);  // one rounding of the result to bf16
    set_num_threads(1);
    const std::vector<BFloat16> one = through_cpu_gemm(c, a, b, c0);
    set_num_threads(2);
    const std::vector<BFloat16> two = through_cpu_gemm(c, a, b, c0);
    CHECK(std::memcmp(one.data(), two.data(), one.size() * 2) == 0);
    CHECK(worst_error(c, a, b, c0, one) <= 1.0 / 128);
    // vdpbf16ps sums the same exact products in the same k order, in f32: a bf16 ulp apart at most.
    gemm_packed::set_amx_bf16_allowed(false);
    CHECK(std::string(cpu_gemm_backend()).find("vdpbf16ps") != std::string::npos);
    const std::vector<BFloat16> dp = through_cpu_gemm(c, a, b, c0);
    gemm_packed::set_amx_bf16_allowed(true);
    CHECK(apart(one, dp) <= 1.0 / 128);
  }
  set_num_threads(saved_threads);
  set_cpu_gemm_kernel(saved);
  set_cpu_gemm_bf16_dot(saved_dot);
}

TEST_CASE("AMX bf16 GEMM: exact on small integers, zero past K", "[cpu_gemm][amx]") {
  if (!gemm_packed::amx_bf16_supported()) {
    WARN("skipped: this CPU (or OS) offers no AMX-BF16");
    return;
  }
  // Integers up to 4 and K = 40 keep every sum exact in f32 and bf16: the result must be exact.
  const Case c{35, 19, 40, Transpose::no, Transpose::no, 1.0f, 0.0f};
  std::vector<BFloat16> a(size_t(c.M * c.K)), b(size_t(c.K * c.N)), c0(size_t(c.M * c.N), BFloat16(7.0f));
  for (size_t i = 0; i < a.size(); ++i) a[i] = BFloat16(float(int(i % 5) - 2));
  for (size_t i = 0; i < b.size(); ++i) b[i] = BFloat16(float(int(i % 3) - 1));
  const std::vector<BFloat16> x = direct(c, a, b, c0);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      float ref = 0;
      for (int64_t k = 0; k < c.K; ++k) ref += float(a[size_t(i * c.K + k)]) * float(b[size_t(k * c.N + j)]);
      REQUIRE(float(x[size_t(i * c.N + j)]) == ref);
    }
}
