// The packed GEMM's AVX2 micro-kernels (ops/cpu_gemm_packed.h): a 6 x 16 tile of C in 12 ymm
// accumulators (two vectors of op(B)'s packed row, op(A)'s 6 values broadcast; 15 of the 16
// registers), and a 3 x 16 tile with twice the accumulators for Eigen's even/odd k order.
// Compiled with target attributes; cpu_gemm calls them only where the CPU has AVX2 and FMA.
#include "ops/cpu_gemm_packed.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>

#define MG_AVX2 __attribute__((target("avx2,fma")))

namespace mg::gemm_packed {
namespace {

constexpr int kNr = 16, kMr = 6;

template <int MR, int NV>
MG_AVX2 inline void step(__m256 (&acc)[MR][2], const float* a, const float* b) {
  const __m256 b0 = _mm256_loadu_ps(b), b1 = NV == 2 ? _mm256_loadu_ps(b + 8) : b0;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m256 ai = _mm256_broadcast_ss(a + i);
    acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
    if (NV == 2) acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
  }
}

// Lanes [0, n) of a vector of 8 set (n clamped to [0, 8]).
MG_AVX2 inline __m256i lanes_below(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

// NV vectors of 8 columns (2: the full sliver, 1: narrow; the packed sliver is kNr wide either way).
template <int MR, int NV, Order O>
MG_AVX2 void kernel(const MicroTile& t) {
  __m256 acc[MR][2], odd[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = odd[i][0] = odd[i][1] = _mm256_setzero_ps();
  const float* a = t.a;
  const float* b = t.b;
  int64_t k = 0;
  if constexpr (O == Order::even_odd) {
    const int64_t peeled = t.kc & ~int64_t(7);
    for (; k < peeled; k += 2, a += 2 * t.a_step, b += 2 * kNr) {
      step<MR, NV>(acc, a, b);
      step<MR, NV>(odd, a + t.a_step, b + kNr);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = _mm256_add_ps(acc[i][0], odd[i][0]);
      acc[i][1] = _mm256_add_ps(acc[i][1], odd[i][1]);
    }
  }
  for (; k < t.kc; ++k, a += t.a_step, b += kNr) step<MR, NV>(acc, a, b);
  const __m256i m[2] = {lanes_below(t.nr), lanes_below(t.nr - 8)};
  const __m256 alpha = _mm256_set1_ps(t.alpha), beta = _mm256_set1_ps(t.beta);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (i >= t.mr) break;
    float* c = t.c + i * t.ldc;
    for (int v = 0; v < NV; ++v) {
      __m256 old = _mm256_setzero_ps();  // Init::zero
      if (t.init == Init::load || t.init == Init::scale) old = _mm256_maskload_ps(c + 8 * v, m[v]);
      if (t.init == Init::bias) old = _mm256_maskload_ps(t.bias + 8 * v, m[v]);
      if (t.init == Init::scale) old = _mm256_mul_ps(beta, old);
      _mm256_maskstore_ps(c + 8 * v, m[v], _mm256_fmadd_ps(acc[i][v], alpha, old));
    }
  }
}

// r[i] lane j -> r[j] lane i: interleaves inside 128-bit lanes, then a swap of lane halves.
MG_AVX2 inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3.
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// One sliver of W lines (n of them real) of a transposing Packer: 8 x 8 blocks in registers.
template <int W>
MG_AVX2 void transposing_sliver(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  const int64_t k8 = kc / 8 * 8;
  for (int r0 = 0; r0 < W; r0 += 8) {
    const int64_t rows = std::min<int64_t>(8, std::max<int64_t>(0, n - r0));
    const int width = std::min(8, W - r0);
    const __m256i store = lanes_below(width);
    for (int64_t k = 0; k < k8; k += 8) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src + (r0 + i) * ld + k) : _mm256_setzero_ps();
      transpose8(r);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        if (width == 8) _mm256_storeu_ps(dst + (k + j) * W + r0, r[j]);
        else _mm256_maskstore_ps(dst + (k + j) * W + r0, store, r[j]);
      }
    }
  }
  for (int64_t k = k8; k < kc; ++k)
    for (int64_t r = 0; r < W; ++r) dst[k * W + r] = r < n ? src[r * ld + k] : 0.0f;
}

// Packers (ops/cpu_gemm_packed.h). Copying reads each stored row once across all slivers.
template <int W>
MG_AVX2 void transposing(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  for (int64_t s = 0; s < n; s += W) transposing_sliver<W>(dst + s * kc, src + s * ld, ld, n - s, kc);
}
template <int W>
MG_AVX2 void copying(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t s = 0; s < n; s += W)
#pragma GCC unroll 2
      for (int c0 = 0; c0 < W; c0 += 8) {
        const __m256 v =
            _mm256_maskload_ps(src + k * ld + s + c0, lanes_below(int(std::clamp<int64_t>(n - s - c0, 0, 8))));
        if (W - c0 >= 8) _mm256_storeu_ps(dst + s * kc + k * W + c0, v);
        else _mm256_maskstore_ps(dst + s * kc + k * W + c0, lanes_below(W - c0), v);
      }
}

}  // namespace

const MicroKernels& avx2_kernels() {
  static const MicroKernels k = [] {
    MicroKernels m{};
    m.kind = GemmKernel::avx2;
    m.mr = kMr;
    m.nr = kNr;
    m.narrow_nr = kNr / 2;
    set_kernels<2, 4, 6>(m, 0, 0, [](auto r) { return &kernel<decltype(r)::value, 2, Order::sequential>; });
    set_kernels<1, 2, 3>(m, 1, 0, [](auto r) { return &kernel<decltype(r)::value, 2, Order::even_odd>; });
    set_kernels<2, 4, 6>(m, 0, 1, [](auto r) { return &kernel<decltype(r)::value, 1, Order::sequential>; });
    set_kernels<2, 4, 6>(m, 1, 1, [](auto r) { return &kernel<decltype(r)::value, 1, Order::even_odd>; });
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
