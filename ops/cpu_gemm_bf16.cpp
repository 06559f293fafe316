// bf16 products on CPUs with AVX512-BF16: vdpbf16ps multiplies pairs of bf16 and adds both
// products to an f32 lane, 32 multiply-adds per instruction where an f32 FMA does 16. One tile of
// cpu_gemm's 16-bit grid at a time (ops/cpu_gemm.cpp: the same tiles and workspace lanes as the
// converting path, so results do not depend on the thread count): op(A)'s rows and op(B)'s columns
// are packed as pairs of consecutive k (one 32-bit word per row or column per pair, 0 past K), a
// 12 x 32 register tile sums all of K in f32, and the tile is rounded to bf16 on store.
// The sums differ from the converting path's (which rounds each product into an f32 FMA chain)
// by f32 rounding only: tests/ops/test_cpu_gemm_bf16.cpp bounds them against f64.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 in the AVX-512 intrinsics
#endif
#include "ops/cpu_gemm_packed.h"

#include <algorithm>
#include <cstring>

#include "core/half_convert.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define MG_BF16 __attribute__((target("avx512f,avx512bf16")))

namespace mg::gemm_packed {
namespace {

constexpr int kMr = 12, kNr = 32;

inline uint16_t bits(BFloat16 x) {
  uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// A pair of k (k0, k0 + 1) of one row or column as a word: low half k0, high half k0 + 1 (0 past K).
template <class At>
inline uint32_t pair(At at, int64_t k0, int64_t K) {
  return uint32_t(bits(at(k0))) | (k0 + 1 < K ? uint32_t(bits(at(k0 + 1))) << 16 : 0u);
}

// n lines (rows of op(A) or columns of op(B)) over K as slivers of W lines: dst[s][p][l] = the
// pair p of line s W + l (0 for lines past n). at(line, k) reads the element.
template <int W, class At>
void pack_pairs(uint32_t* dst, int64_t n, int64_t K, At at) {
  const int64_t kp = (K + 1) / 2;
  for (int64_t s = 0; s < n; s += W, dst += kp * W)
    for (int64_t p = 0; p < kp; ++p)
      for (int64_t l = 0; l < W; ++l)
        dst[p * W + l] = s + l < n ? pair([&](int64_t k) { return at(s + l, k); }, 2 * p, K) : 0u;
}

// c (mr x nr of a row stride ldc, f32) = alpha * sum over the kp pairs + beta * c (c not read when
// beta is 0). a: kMr words per pair, b: kNr words per pair.
template <int MR>
MG_BF16 void kernel(int64_t kp, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, int mr, int nr,
                    float alpha, float beta) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p, a += kMr, b += kNr) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(int(a[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  const __mmask16 m[2] = {__mmask16(nr >= 16 ? 0xFFFF : (1u << nr) - 1),
                          __mmask16(nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (1u << (nr - 16)) - 1)};
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int i = 0; i < MR && i < mr; ++i)
    for (int v = 0; v < 2; ++v) {
      float* ci = c + i * ldc + 16 * v;
      __m512 r = _mm512_mul_ps(va, acc[i][v]);
      if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[v], ci), r);
      _mm512_mask_storeu_ps(ci, m[v], r);
    }
}

}  // namespace

bool bf16_pairs_supported() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

int64_t bf16_pairs_workspace_floats(int64_t rows, int64_t cols, int64_t K) {
  const int64_t kp = (K + 1) / 2;
  return (rows + kMr - 1) / kMr * kMr * kp + (cols + kNr - 1) / kNr * kNr * kp + rows * cols;
}

void bf16_pairs_gemm(Transpose ta, Transpose tb, int64_t rows, int64_t cols, int64_t K, float alpha,
                     const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta, BFloat16* C,
                     int64_t ldc, float* ws) {
  const int64_t kp = (K + 1) / 2;
  uint32_t* pa = reinterpret_cast<uint32_t*>(ws);  // (rows / kMr) slivers of kp x kMr words
  uint32_t* pb = pa + (rows + kMr - 1) / kMr * kMr * kp;
  float* pc = reinterpret_cast<float*>(pb + (cols + kNr - 1) / kNr * kNr * kp);  // (rows, cols) f32
  const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
  pack_pairs<kMr>(pa, rows, K, [&](int64_t i, int64_t k) { return at ? A[k * lda + i] : A[i * lda + k]; });
  pack_pairs<kNr>(pb, cols, K, [&](int64_t j, int64_t k) { return bt ? B[j * ldb + k] : B[k * ldb + j]; });
  if (beta != 0.0f) convert_block(static_cast<const BFloat16*>(C), ldc, pc, cols, rows, cols);
  for (int64_t i = 0; i < rows; i += kMr)
    for (int64_t j = 0; j < cols; j += kNr) {
      const int mr = int(std::min<int64_t>(kMr, rows - i)), nr = int(std::min<int64_t>(kNr, cols - j));
      const uint32_t* a = pa + i * kp;
      const uint32_t* b = pb + j * kp;
      float* c = pc + i * cols + j;
      if (mr <= 4) kernel<4>(kp, a, b, c, cols, mr, nr, alpha, beta);
      else if (mr <= 8) kernel<8>(kp, a, b, c, cols, mr, nr, alpha, beta);
      else kernel<12>(kp, a, b, c, cols, mr, nr, alpha, beta);
    }
  convert_block(static_cast<const float*>(pc), cols, C, ldc, rows, cols);  // round on store
}

}  // namespace mg::gemm_packed

#else  // no x86: the converting path only

namespace mg::gemm_packed {
bool bf16_pairs_supported() { return false; }
int64_t bf16_pairs_workspace_floats(int64_t, int64_t, int64_t) { return 0; }
void bf16_pairs_gemm(Transpose, Transpose, int64_t, int64_t, int64_t, float, const BFloat16*, int64_t,
                     const BFloat16*, int64_t, float, BFloat16*, int64_t, float*) {}
}  // namespace mg::gemm_packed

#endif
