// The vectorised f32 <-> bf16 / f16 span conversions (see core/half_convert.h). Each function
// runs 16-lane (AVX-512) or 8-lane (AVX2 / F16C) blocks, then the scalar conversion for the tail.
#include "core/half_convert.h"

#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mg {

void convert_span(const BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {  // widen to 32 bits, shift the bf16 bits into the high half
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = float(src[i]);
}

void convert_span(const float* src, BFloat16* dst, int64_t n) {
  int64_t i = 0;
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  for (; i + 16 <= n; i += 16) {
    __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    // Round to nearest even: add 0x7fff plus the lowest kept bit, keep the high 16 bits.
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
    // NaN: the high bits with the quiet bit set (never rounded into an infinity).
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtepi32_epi16(r));
  }
#elif defined(__AVX2__)
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
    // |u| > inf as signed compare is fine: both sides are non-negative.
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet), nan);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);  // values fit 16 bits
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) dst[i] = BFloat16(src[i]);
}

void convert_span(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
  for (; i < n; ++i) dst[i] = float(src[i]);
}

void convert_span(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = Half(src[i]);
}

const char* half_convert_isa() {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  return "AVX-512 (bf16 integer rounding, f16 vcvtph2ps/vcvtps2ph)";
#elif defined(__AVX2__) && defined(__F16C__)
  return "AVX2 + F16C";
#elif defined(__F16C__)
  return "F16C (bf16 scalar)";
#else
  return "scalar";
#endif
}

}  // namespace mg
