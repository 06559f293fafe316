// The 16-bit CPU kernels behind mixed precision: the vectorised span conversions give the same
// bits as the scalar Half / BFloat16 conversions (ties, subnormals, overflow, inf, NaN), and the
// converting GEMM (tiles of f16 / bf16 turned into f32 panels) matches an f64 reference for every
// transpose combination, with beta, on a product big enough to be cut into tiles.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "core/half_convert.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/cpu_gemm.h"

using namespace mg;

namespace {

std::vector<float> special_floats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e6f, -1e30f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 1e-40f, -3e-39f, 6e-8f, 3e-8f, 1e-5f};
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7fffffu, 0x00000001u, 0x33000001u})
    v.push_back(bits_float(bits));  // bf16 ties (round to even), largest float, tiny subnormals
  Generator g(5);
  for (int i = 0; i < 1000; ++i) v.push_back((g.uniform_at(uint64_t(i)) - 0.5f) * std::ldexp(1.0f, (i % 60) - 30));
  return v;
}

template <class H>
void check_spans() {
  std::vector<float> f = special_floats();
  const int64_t n = int64_t(f.size());
  std::vector<H> vec(f.size());
  convert_span(f.data(), vec.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    INFO("value " << f[size_t(i)] << " bits " << float_bits(f[size_t(i)]));
    const H s(f[size_t(i)]);
    if (std::isnan(f[size_t(i)])) CHECK(std::isnan(float(vec[size_t(i)])));
    else CHECK(vec[size_t(i)].bits == s.bits);
  }
  std::vector<float> back(f.size());
  convert_span(vec.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const float s = float(vec[size_t(i)]);
    if (std::isnan(s)) CHECK(std::isnan(back[size_t(i)]));
    else CHECK(float_bits(back[size_t(i)]) == float_bits(s));
  }
}

template <class H>
void check_gemm(double tol) {
  // (M, N, K) = (96, 80, 4096): 2^25 multiply-adds, above the serial limit, so cut into tiles.
  const int64_t M = 96, N = 80, K = 4096;
  Generator g(9);
  for (Transpose ta : {Transpose::no, Transpose::yes})
    for (Transpose tb : {Transpose::no, Transpose::yes}) {
      INFO("ta " << int(ta == Transpose::yes) << " tb " << int(tb == Transpose::yes));
      const int64_t lda = (ta == Transpose::yes ? M : K) + 3, ldb = (tb == Transpose::yes ? K : N) + 5, ldc = N + 2;
      std::vector<H> A(size_t((ta == Transpose::yes ? K : M) * lda)), B(size_t((tb == Transpose::yes ? N : K) * ldb));
      std::vector<H> C(size_t(M * ldc));
      for (size_t i = 0; i < A.size(); ++i) A[i] = H(g.uniform_at(i) - 0.5f);
      for (size_t i = 0; i < B.size(); ++i) B[i] = H(g.uniform_at(i + A.size()) - 0.5f);
      for (size_t i = 0; i < C.size(); ++i) C[i] = H(g.uniform_at(i + 7 * A.size()) - 0.5f);
      std::vector<H> C0 = C;
      const float alpha = 0.5f, beta = 2.0f;
      Tensor ws = empty({cpu_gemm_workspace_floats(M, N, K)}, {.dtype = DType::f32});
      cpu_gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc, ws.data<float>());
      double worst = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double a = float(ta == Transpose::yes ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)]);
            const double b = float(tb == Transpose::yes ? B[size_t(j * ldb + k)] : B[size_t(k * ldb + j)]);
            acc += a * b;
          }
          const double ref = alpha * acc + beta * double(float(C0[size_t(i * ldc + j)]));
          worst = std::max(worst, std::abs(double(float(C[size_t(i * ldc + j)])) - ref) / (1.0 + std::abs(ref)));
        }
      CHECK(worst <= tol);  // one rounding of the result to 16 bits, the sum in f32
      CHECK(C[size_t(ldc - 1)].bits == C0[size_t(ldc - 1)].bits);  // padding past N is not written
    }
}

}  // namespace

TEST_CASE("low precision: vectorised conversions match the scalar ones bit for bit") {
  INFO(half_convert_isa());
  check_spans<BFloat16>();
  check_spans<Half>();
}

TEST_CASE("low precision: the converting GEMM (bf16, f16) matches an f64 reference") {
  check_gemm<BFloat16>(1.0 / 128);  // bf16: 2^-8 relative rounding of the result
  check_gemm<Half>(1.0 / 1024);     // f16: 2^-11
}
