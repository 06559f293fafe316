// The requantization every int8 kernel ends with (ops/int8_gemm.h, ops/int8_depthwise.h): an
// int32 sum c (less a correction corr) becomes
//   f32: v = min(max(fma(float(c - corr), scale, bias), lo), hi)
//   u8:  quantize_u8(v, out_inv_scale, out_zero), the next int8 layer's input, so two int8 layers
//        in a row pass u8 activations with no f32 tensor between them.
// Rows of n values, 8 at a time with AVX2 + FMA where compiled in, the same arithmetic (one fused
// multiply-add, one rounding to nearest even) in the scalar tail, so every path gives the same bits.
// quantize_u8 and Requant are MG_HOST_DEVICE: the CUDA kernels (ops/cuda/int8_*.cu) call these very
// functions, so a GPU result equals the CPU's bit for bit.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/half.h"  // MG_HOST_DEVICE

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
#include <immintrin.h>
#define MG_INT8_REQUANT_AVX2 1
#endif

namespace mg {

// Round half to even, add the zero point, clamp to [0, 255] in f32 (NaN becomes 0, as the SIMD max does).
MG_HOST_DEVICE uint8_t quantize_u8(float x, float inv_scale, int32_t zero) {
#if defined(__CUDA_ARCH__)
  float r = rintf(__fmul_rn(x, inv_scale)) + float(zero);  // rintf: to nearest even, as nearbyint
#else
  float r = std::nearbyint(x * inv_scale) + float(zero);
#endif
  r = r > 0.f ? r : 0.f;
  r = r < 255.f ? r : 255.f;
  return uint8_t(r);
}

struct Requant {
  float scale = 1.f, bias = 0.f, lo = -3.4e38f, hi = 3.4e38f;
  float out_inv_scale = 1.f;  // u8 output only
  int32_t out_zero = 0;
  // min(max(v, lo), hi) with std::max / std::min's comparisons, written out for device code.
  MG_HOST_DEVICE float f32(int32_t c) const {
#if defined(__CUDA_ARCH__)
    const float v = fmaf(float(c), scale, bias);
#else
    const float v = std::fma(float(c), scale, bias);
#endif
    const float above = v < lo ? lo : v;  // std::max(v, lo)
    return hi < above ? hi : above;        // std::min(above, hi)
  }
  MG_HOST_DEVICE uint8_t u8(int32_t c) const { return quantize_u8(f32(c), out_inv_scale, out_zero); }
};

#if defined(MG_INT8_REQUANT_AVX2)
inline __m256 requant_lanes(const int32_t* acc, __m256i corr, __m256 s, __m256 b, __m256 lo, __m256 hi) {
  const __m256i c = _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc)), corr);
  return _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(c), s, b), lo), hi);
}
#endif

// dst[i] = quantize_u8(x[i], inv_scale, zero), i < n: f32 activations into an int8 layer's input.
inline void quantize_row_u8(const float* x, int64_t n, float inv_scale, int32_t zero, uint8_t* dst) {
  int64_t i = 0;
#if defined(MG_INT8_REQUANT_AVX2)
  const __m256 inv = _mm256_set1_ps(inv_scale), vz = _mm256_set1_ps(float(zero)), top = _mm256_set1_ps(255.f);
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, vz), _mm256_setzero_ps()), top);  // max(NaN, 0) = 0
    const __m256i v = _mm256_cvttps_epi32(r);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(w, w));
  }
#endif
  for (; i < n; ++i) dst[i] = quantize_u8(x[i], inv_scale, zero);
}

// dst[i] = q.f32(acc[i] - corr), i < n.
inline void requant_row_f32(const int32_t* acc, int64_t n, int32_t corr, const Requant& q, float* dst) {
  int64_t i = 0;
#if defined(MG_INT8_REQUANT_AVX2)
  const __m256i vc = _mm256_set1_epi32(corr);
  const __m256 s = _mm256_set1_ps(q.scale), b = _mm256_set1_ps(q.bias), lo = _mm256_set1_ps(q.lo),
               hi = _mm256_set1_ps(q.hi);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, requant_lanes(acc + i, vc, s, b, lo, hi));
#endif
  for (; i < n; ++i) dst[i] = q.f32(acc[i] - corr);
}

// dst[i] = q.u8(acc[i] - corr), i < n.
inline void requant_row_u8(const int32_t* acc, int64_t n, int32_t corr, const Requant& q, uint8_t* dst) {
  int64_t i = 0;
#if defined(MG_INT8_REQUANT_AVX2)
  const __m256i vc = _mm256_set1_epi32(corr);
  const __m256 s = _mm256_set1_ps(q.scale), b = _mm256_set1_ps(q.bias), lo = _mm256_set1_ps(q.lo),
               hi = _mm256_set1_ps(q.hi), inv = _mm256_set1_ps(q.out_inv_scale),
               zero = _mm256_set1_ps(float(q.out_zero)), top = _mm256_set1_ps(255.f);
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(requant_lanes(acc + i, vc, s, b, lo, hi), inv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zero), _mm256_setzero_ps()), top);
    const __m256i v = _mm256_cvttps_epi32(r);  // [0, 255]
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(w, w));
  }
#endif
  for (; i < n; ++i) dst[i] = q.u8(acc[i] - corr);
}

}  // namespace mg
