// The packed GEMM's AVX-512 micro-kernels (ops/cpu_gemm_packed.h): a 14 x 32 tile of C in 28 zmm
// accumulators (two vectors of op(B)'s packed row, op(A)'s 14 values broadcast; 31 of the 32
// registers: 14 rows were ~4% faster than 12 on Zen 4, bench/bench_matmul.cpp), a 6 x 32 tile with
// twice the accumulators for Eigen's even/odd k order, one-vector tiles for narrow column slivers,
// and 4- and 8-row tiles for row tails. Compiled with target attributes, so a build without
// -march=native still has them; cpu_gemm calls them only where the CPU has AVX-512.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 in the AVX-512 shuffle intrinsics
#endif
#include "ops/cpu_gemm_packed.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>

#define MG_AVX512 __attribute__((target("avx512f,fma")))

namespace mg::gemm_packed {
namespace {

constexpr int kNr = 32, kMr = 14;

// The first n lanes of 16 (n clamped to [0, 16]).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// How many k steps ahead the kernels prefetch op(B)'s packed sliver into L1: the chunk is packed
// for L2 (kPanelFloats), and without the hint each step waits on L2 for its two lines (a 14 x 32
// kernel streaming 16 slivers from L2: 136 GFLOP/s without, 166 with, 199 the FMA peak, on a
// Sapphire Rapids core). bench_matmul's GPT products, medians of 3: Sapphire Rapids 1 thread
// qkv 126 -> 140, fc 121 -> 141, proj 109 -> 126 GFLOP/s; AMD Zen 4 1 thread within 3% either way,
// 2 threads fc_dw 121 -> 183, fc_dx 143 -> 193, qkv 198 -> 213. A hint changes no arithmetic.
// (The same hint for the rows transposing_sliver reads was mixed on both CPUs and is not used.)
constexpr int kPrefetchSteps = 8;

// acc[i][v] = fma(a[i], b[v], acc[i][v]) for one k step.
template <int MR, int NV>
MG_AVX512 inline void step(__m512 (&acc)[MR][2], const float* a, const float* b) {
  _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchSteps * kNr), _MM_HINT_T0);
  if (NV == 2) _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchSteps * kNr + 16), _MM_HINT_T0);
  const __m512 b0 = _mm512_loadu_ps(b), b1 = NV == 2 ? _mm512_loadu_ps(b + 16) : b0;
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    const __m512 ai = _mm512_set1_ps(a[i]);
    acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
    if (NV == 2) acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
  }
}

// NV vectors of 16 columns (2: the full sliver, 1: narrow; the packed sliver is kNr wide either way).
template <int MR, int NV, Order O>
MG_AVX512 void kernel(const MicroTile& t) {
  __m512 acc[MR][2], odd[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = odd[i][0] = odd[i][1] = _mm512_setzero_ps();
  const float* a = t.a;
  const float* b = t.b;
  int64_t k = 0;
  if constexpr (O == Order::even_odd) {
    const int64_t peeled = t.kc & ~int64_t(7);
    for (; k < peeled; k += 2, a += 2 * t.a_step, b += 2 * kNr) {
      step<MR, NV>(acc, a, b);
      step<MR, NV>(odd, a + t.a_step, b + kNr);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = _mm512_add_ps(acc[i][0], odd[i][0]);
      acc[i][1] = _mm512_add_ps(acc[i][1], odd[i][1]);
    }
  }
  for (; k < t.kc; ++k, a += t.a_step, b += kNr) step<MR, NV>(acc, a, b);
  const __mmask16 m0 = first_lanes(t.nr), m1 = first_lanes(t.nr - 16);
  const __m512 alpha = _mm512_set1_ps(t.alpha), beta = _mm512_set1_ps(t.beta);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if (i >= t.mr) break;
    float* c = t.c + i * t.ldc;
    const __mmask16 m[2] = {m0, m1};
    for (int v = 0; v < NV; ++v) {
      __m512 old = _mm512_setzero_ps();  // Init::zero
      if (t.init == Init::load || t.init == Init::scale) old = _mm512_maskz_loadu_ps(m[v], c + 16 * v);
      if (t.init == Init::bias) old = _mm512_maskz_loadu_ps(m[v], t.bias + 16 * v);
      if (t.init == Init::scale) old = _mm512_mul_ps(beta, old);
      _mm512_mask_storeu_ps(c + 16 * v, m[v], _mm512_fmadd_ps(acc[i][v], alpha, old));
    }
  }
}

// r[i] lane j -> r[j] lane i: 32-bit then 64-bit interleaves inside 128-bit lanes, then two rounds
// of 128-bit lane shuffles.
MG_AVX512 inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3.
  __m512 u[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 lo01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), hi01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    const __m512 lo23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 hi23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);       // column c
    r[4 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);   // column 4 + c
    r[8 + c] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);   // column 8 + c
    r[12 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);  // column 12 + c
  }
}

// One sliver of W lines (n of them real) of a transposing Packer: 16 x 16 blocks in registers.
template <int W>
MG_AVX512 void transposing_sliver(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  const int64_t k16 = kc / 16 * 16;
  for (int r0 = 0; r0 < W; r0 += 16) {
    const int64_t rows = std::min<int64_t>(16, std::max<int64_t>(0, n - r0));
    const __mmask16 store = first_lanes(W - r0);
    for (int64_t k = 0; k < k16; k += 16) {
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + (r0 + i) * ld + k) : _mm512_setzero_ps();
      transpose16(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) _mm512_mask_storeu_ps(dst + (k + j) * W + r0, store, r[j]);
    }
  }
  for (int64_t k = k16; k < kc; ++k)
    for (int64_t r = 0; r < W; ++r) dst[k * W + r] = r < n ? src[r * ld + k] : 0.0f;
}

// Packers (ops/cpu_gemm_packed.h). Copying reads each stored row once across all slivers.
template <int W>
MG_AVX512 void transposing(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  for (int64_t s = 0; s < n; s += W) transposing_sliver<W>(dst + s * kc, src + s * ld, ld, n - s, kc);
}
template <int W>
MG_AVX512 void copying(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t s = 0; s < n; s += W)
#pragma GCC unroll 2
      for (int c0 = 0; c0 < W; c0 += 16)
        _mm512_mask_storeu_ps(dst + s * kc + k * W + c0, first_lanes(W - c0),
                              _mm512_maskz_loadu_ps(first_lanes(n - s - c0), src + k * ld + s + c0));
}

}  // namespace

const MicroKernels& avx512_kernels() {
  static const MicroKernels k = [] {
    MicroKernels m{};
    m.kind = GemmKernel::avx512;
    m.mr = kMr;
    m.nr = kNr;
    m.narrow_nr = kNr / 2;
    set_kernels<4, 8, 14>(m, 0, 0, [](auto r) { return &kernel<decltype(r)::value, 2, Order::sequential>; });
    set_kernels<2, 4, 6>(m, 1, 0, [](auto r) { return &kernel<decltype(r)::value, 2, Order::even_odd>; });
    set_kernels<4, 8, 14>(m, 0, 1, [](auto r) { return &kernel<decltype(r)::value, 1, Order::sequential>; });
    set_kernels<4, 8, 14>(m, 1, 1, [](auto r) { return &kernel<decltype(r)::value, 1, Order::even_odd>; });
    m.pack_a_transposing = &transposing<kMr>;
    m.pack_a_copying = &copying<kMr>;
    m.pack_b_transposing = &transposing<kNr>;
    m.pack_b_copying = &copying<kNr>;
    return m;
  }();
  return k;
}

}  // namespace mg::gemm_packed
#endif
