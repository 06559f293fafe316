// int8 GEMM: every path this CPU has (AVX-512 VNNI, AVX2, scalar) against the scalar int32
// reference, bit for bit: odd sizes and tails in every dimension, every zero point, the f32 and u8
// requantizing epilogues, B quantized from f32 while packing (ties, NaN, huge values) or read from
// u8, NCHW and transposed layouts, thread-count independence, and errors.
#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/int8_gemm.h"
#include "tests/ops/int8_isa_paths.h"

using namespace mg;

namespace {

struct Problem {
  int64_t M, N, K;
  std::vector<int8_t> a;
  std::vector<uint8_t> b;  // (K, N) row-major
};

Problem make(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{M, N, K, std::vector<int8_t>(size_t(M * K)), std::vector<uint8_t>(size_t(K * N))};
  std::uniform_int_distribution<int> da(-128, 127), db(0, 255);
  for (auto& v : p.a) v = int8_t(da(rng));
  for (auto& v : p.b) v = uint8_t(db(rng));
  // extremes included, so any saturation (e.g. vpmaddubsw's s16) would show
  if (M * K > 0) p.a[0] = -128;
  if (K * N > 0) p.b[0] = 255;
  return p;
}

Tensor a_tensor(const Problem& p) {
  Tensor t = empty({p.M, p.K}, {.dtype = DType::i8});
  if (!p.a.empty()) std::memcpy(t.data_ptr(), p.a.data(), p.a.size());
  return t;
}

std::vector<int32_t> reference(const Problem& p, int32_t zero) {
  std::vector<int32_t> c(size_t(p.M * p.N), -7);
  int8_gemm_ref(p.M, p.N, p.K, p.a.data(), p.K, p.b.data(), p.N, zero, c.data(), p.N);
  return c;
}

const Int8Layout row_major(int64_t cols) { return {.group = std::max<int64_t>(cols, 1), .group_stride = 0, .col_stride = 1, .row_stride = cols}; }

}  // namespace

TEST_CASE("int8_gemm int32 output equals the scalar reference bit for bit", "[int8]") {
  MG_FOR_EACH_INT8_ISA();
  const int64_t sizes[][3] = {{1, 1, 1},   {3, 5, 7},    {4, 16, 2},  {8, 32, 4},   {9, 33, 5},
                              {13, 37, 19}, {33, 65, 130}, {17, 1, 64}, {1, 100, 3}, {64, 48, 96}, {5, 7, 0}};
  uint32_t seed = 1;
  for (const auto& s : sizes)
    for (int32_t zero : {0, 1, 128, 255}) {
      const Problem p = make(s[0], s[1], s[2], seed++);
      INFO("M=" << p.M << " N=" << p.N << " K=" << p.K << " zero=" << zero);
      const Int8PackedA pa = int8_pack_a(a_tensor(p));
      std::vector<int32_t> c(size_t(p.M * p.N), -7);
      int8_gemm(pa, p.N, p.b.data(), row_major(p.N), zero, {.i32 = c.data(), .layout = row_major(p.N)});
      REQUIRE(c == reference(p, zero));
    }
}

TEST_CASE("int8_gemm's largest sums stay exact (no s16 saturation)", "[int8]") {
  MG_FOR_EACH_INT8_ISA();
  // every product is -128 * 255 (the extreme a u8 x s8 product): vpmaddubsw would clip pairs
  Problem p{6, 20, 257, std::vector<int8_t>(6 * 257, -128), std::vector<uint8_t>(257 * 20, 255)};
  const Int8PackedA pa = int8_pack_a(a_tensor(p));
  std::vector<int32_t> c(size_t(6 * 20));
  int8_gemm(pa, 20, p.b.data(), row_major(20), 0, {.i32 = c.data(), .layout = row_major(20)});
  for (int32_t v : c) REQUIRE(v == -128 * 255 * 257);
  REQUIRE(c == reference(p, 0));
}

TEST_CASE("int8_gemm f32 epilogue equals fma requantization of the reference", "[int8]") {
  MG_FOR_EACH_INT8_ISA();
  const Problem p = make(21, 45, 67, 99);
  const int32_t zero = 77;
  std::vector<float> scale(size_t(p.M)), bias(size_t(p.M));
  for (int64_t m = 0; m < p.M; ++m) {
    scale[size_t(m)] = 1e-4f * float(m + 1);
    bias[size_t(m)] = 0.1f * float(m) - 1.f;
  }
  const float lo = -0.5f, hi = 2.f;
  const std::vector<int32_t> ref = reference(p, zero);
  std::vector<float> expect(ref.size());
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      const float v = std::fma(float(ref[size_t(m * p.N + n)]), scale[size_t(m)], bias[size_t(m)]);
      expect[size_t(m * p.N + n)] = std::min(std::max(v, lo), hi);
    }
  std::vector<float> got(ref.size(), 1234.f);
  const Int8PackedA pa = int8_pack_a(a_tensor(p));
  int8_gemm(pa, p.N, p.b.data(), row_major(p.N), zero,
            {.f32 = got.data(), .layout = row_major(p.N), .row_scale = scale.data(), .bias = bias.data(),
             .clamp_lo = lo, .clamp_hi = hi});
  REQUIRE(std::memcmp(got.data(), expect.data(), got.size() * sizeof(float)) == 0);
  int clamped = 0;
  for (float v : expect) clamped += (v == lo || v == hi);
  REQUIRE(clamped > 0);  // the clamp was exercised

  // u8 output: the same values quantized for the next layer
  const float out_scale = 0.01f;
  std::vector<uint8_t> got_u8(ref.size(), 7);
  int8_gemm(pa, p.N, p.b.data(), row_major(p.N), zero,
            {.u8 = got_u8.data(), .layout = row_major(p.N), .row_scale = scale.data(), .bias = bias.data(),
             .clamp_lo = lo, .clamp_hi = hi, .out_inv_scale = 1.f / out_scale, .out_zero = 50});
  for (size_t i = 0; i < ref.size(); ++i)
    if (got_u8[i] != quantize_u8(expect[i], 1.f / out_scale, 50)) FAIL_CHECK("u8 element " << i);
}

TEST_CASE("int8_gemm_quantize_b equals quantize_u8 then the reference, NCHW and transposed layouts", "[int8]") {
  MG_FOR_EACH_INT8_ISA();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3.f, 9.f);
  const float scale = 0.05f, inv = 1.f / scale;
  const int32_t zero = 60;
  for (auto [M, C, imgs, HW] : std::vector<std::array<int64_t, 4>>{{24, 16, 3, 16}, {7, 19, 2, 5}, {40, 33, 4, 64}, {3, 8, 5, 1}}) {
    INFO("M=" << M << " C=" << C << " images=" << imgs << " HW=" << HW);
    // x: NCHW (imgs, C, HW) seen as B (C, imgs*HW)
    std::vector<float> x(size_t(imgs * C * HW));
    for (auto& v : x) v = d(rng);
    x[0] = std::numeric_limits<float>::quiet_NaN();
    x[1] = 1e30f;
    x[2] = -1e30f;
    x[3] = 2.5f * scale;  // a tie: nearbyint rounds half to even
    Problem p = make(M, imgs * HW, C, uint32_t(M * 7 + C));
    const Int8Layout nchw{.group = HW, .group_stride = C * HW, .col_stride = 1, .row_stride = HW};
    for (int64_t k = 0; k < C; ++k)
      for (int64_t n = 0; n < p.N; ++n) p.b[size_t(k * p.N + n)] = quantize_u8(x[size_t(nchw.offset(k, n))], inv, zero);
    REQUIRE(p.b[0] == 0);  // NaN -> 0
    const std::vector<int32_t> ref = reference(p, zero);
    // output NCHW (imgs, M, HW) too
    std::vector<int32_t> got(size_t(imgs * M * HW), -1);
    const Int8Layout out_nchw{.group = HW, .group_stride = M * HW, .col_stride = 1, .row_stride = HW};
    const Int8PackedA pa = int8_pack_a(a_tensor(p));
    int8_gemm_quantize_b(pa, p.N, x.data(), nchw, inv, zero, {.i32 = got.data(), .layout = out_nchw});
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < p.N; ++n) REQUIRE(got[size_t(out_nchw.offset(m, n))] == ref[size_t(m * p.N + n)]);
    // the same activations already quantized (u8 NCHW, as an int8 layer before hands them on)
    std::vector<uint8_t> xq(x.size());
    for (size_t i = 0; i < x.size(); ++i) xq[i] = quantize_u8(x[i], inv, zero);
    std::fill(got.begin(), got.end(), -1);
    int8_gemm(pa, p.N, xq.data(), nchw, zero, {.i32 = got.data(), .layout = out_nchw});
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < p.N; ++n) REQUIRE(got[size_t(out_nchw.offset(m, n))] == ref[size_t(m * p.N + n)]);
    // B as the transpose of a row-major (N, K) matrix, output transposed (N, M): a Linear layer's layout
    std::vector<float> xt(size_t(p.N * C));
    for (int64_t k = 0; k < C; ++k)
      for (int64_t n = 0; n < p.N; ++n) xt[size_t(n * C + k)] = x[size_t(nchw.offset(k, n))];
    std::vector<int32_t> gt(size_t(p.N * M), -1);
    int8_gemm_quantize_b(pa, p.N, xt.data(), {.group = 1, .group_stride = C, .col_stride = 0, .row_stride = 1}, inv,
                         zero, {.i32 = gt.data(), .layout = {.group = 1, .group_stride = M, .col_stride = 0, .row_stride = 1}});
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < p.N; ++n) REQUIRE(gt[size_t(n * M + m)] == ref[size_t(m * p.N + n)]);
  }
}

TEST_CASE("int8_gemm gives the same bits on 1 and 2 threads", "[int8]") {
  MG_FOR_EACH_INT8_ISA();
  const Problem p = make(96, 300, 160, 3);
  const Int8PackedA pa = int8_pack_a(a_tensor(p));
  std::vector<int32_t> c1(size_t(p.M * p.N)), c2(c1.size());
  const int before = num_threads();
  set_num_threads(1);
  int8_gemm(pa, p.N, p.b.data(), row_major(p.N), 3, {.i32 = c1.data(), .layout = row_major(p.N)});
  set_num_threads(2);
  int8_gemm(pa, p.N, p.b.data(), row_major(p.N), 3, {.i32 = c2.data(), .layout = row_major(p.N)});
  set_num_threads(before);
  REQUIRE(c1 == c2);
  REQUIRE(c1 == reference(p, 3));
}

TEST_CASE("int8_gemm rejects bad arguments with clear errors", "[int8]") {
  REQUIRE_THROWS_WITH(int8_pack_a(zeros({2, 3})), Catch::Contains("expected a contiguous 2-d i8 tensor"));;
  const Int8PackedA pa = int8_pack_a(zeros({2, 3}, {.dtype = DType::i8}));
  std::vector<uint8_t> b(12, 1);
  std::vector<int32_t> c(8);
  REQUIRE_THROWS_WITH(int8_gemm(pa, 4, b.data(), row_major(4), 0, {.layout = row_major(4)}),
                      Catch::Contains("exactly one of out.i32, out.f32 and out.u8"));
  REQUIRE_THROWS_WITH(int8_gemm(pa, 4, b.data(), row_major(4), 300, {.i32 = c.data(), .layout = row_major(4)}),
                      Catch::Contains("zero point 300"));
  std::vector<float> x(12, 1.f), y(8);
  REQUIRE_THROWS_WITH(int8_gemm_quantize_b(pa, 4, x.data(), row_major(4), 0.f, 0, {.f32 = y.data(), .layout = row_major(4)}),
                      Catch::Contains("need row_scale"));
  std::vector<float> s(2, 1.f);
  REQUIRE_THROWS_WITH(int8_gemm_quantize_b(pa, 4, x.data(), row_major(4), 0.f, 0,
                                           {.f32 = y.data(), .layout = row_major(4), .row_scale = s.data()}),
                      Catch::Contains("1/scale must be finite and positive"));
}
