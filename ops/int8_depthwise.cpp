// Int8 depthwise convolution kernels (ops/int8_depthwise.h). One (image, channel) plane at a time,
// planes in parallel; within a plane each output row sums its K x K taps. Columns whose taps all
// lie inside the image go 16 at a time through AVX2; the border columns and strides other than 1
// take the scalar loop, which sums in the same int32 arithmetic, so every path gives the same bits.
// Scratch (a padded plane, a row of sums, a plane of sums: a few KiB per thread) is std::vector,
// the one exception to allocator memory here: it is per-thread, tiny and freed at return.
#include "ops/int8_depthwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/parallel.h"

namespace mg {
namespace {

// One output value at (oh, ow) of a plane, scalar.
inline int32_t tap_sum(const Int8DepthwiseShape& s, const uint8_t* xp, int32_t zx, const int8_t* wp, int64_t oh,
                       int64_t ow) {
  int32_t acc = 0;
  for (int64_t kh = 0; kh < s.K; ++kh) {
    const int64_t ih = oh * s.stride - s.padding + kh;
    if (ih < 0 || ih >= s.H) continue;
    for (int64_t kw = 0; kw < s.K; ++kw) {
      const int64_t iw = ow * s.stride - s.padding + kw;
      if (iw < 0 || iw >= s.W) continue;
      acc += int32_t(wp[kh * s.K + kw]) * (int32_t(xp[ih * s.W + iw]) - zx);
    }
  }
  return acc;
}

// One plane's int32 sums into acc (OH * OW). `scratch` holds the plane copied into a frame of
// zero points (padding and a tail up to a multiple of 16 columns), so the AVX2 loop needs no
// bounds checks at the borders: a zero point contributes (zx - zx) * w = 0, exactly as the
// reference's padding.
void plane(const Int8DepthwiseShape& s, const uint8_t* xp, int32_t zx, const int8_t* wp, int32_t* acc,
           std::vector<uint8_t>& scratch, std::vector<int32_t>& row_acc) {
  const int64_t OH = s.OH(), OW = s.OW();
#if defined(__AVX2__)
  if (s.stride == 1) {
    const int64_t OWp = (OW + 15) / 16 * 16, Wp = OWp + s.K - 1, Hp = s.H + 2 * s.padding;
    scratch.assign(static_cast<size_t>(Hp * Wp), uint8_t(zx));
    for (int64_t h = 0; h < s.H; ++h)
      std::copy(xp + h * s.W, xp + (h + 1) * s.W, scratch.data() + (h + s.padding) * Wp + s.padding);
    row_acc.resize(static_cast<size_t>(OWp));
    const __m256i vz = _mm256_set1_epi16(int16_t(zx));
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OWp; ow += 16) {
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        for (int64_t kh = 0; kh < s.K; ++kh) {
          const uint8_t* src = scratch.data() + (oh + kh) * Wp + ow;
          for (int64_t kw = 0; kw < s.K; ++kw) {
            const __m256i xv = _mm256_sub_epi16(
                _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kw))), vz);
            // |x - zx| <= 255 and |w| <= 127 (symmetric weights): the product is exact in s16
            const __m256i p = _mm256_mullo_epi16(xv, _mm256_set1_epi16(int16_t(wp[kh * s.K + kw])));
            a0 = _mm256_add_epi32(a0, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(p)));
            a1 = _mm256_add_epi32(a1, _mm256_cvtepi16_epi32(_mm256_extracti128_si256(p, 1)));
          }
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row_acc.data() + ow), a0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row_acc.data() + ow + 8), a1);
      }
      std::copy(row_acc.begin(), row_acc.begin() + OW, acc + oh * OW);
    }
    return;
  }
#endif
  (void)scratch;
  (void)row_acc;
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) acc[oh * OW + ow] = tap_sum(s, xp, zx, wp, oh, ow);
}

void check_weights(const Int8DepthwiseShape& s, const int8_t* w) {
  // the AVX2 path's s16 products need |w| <= 127 (quantize_per_channel's range); -128 is refused
  for (int64_t i = 0; i < s.C * s.K * s.K; ++i)
    MG_CHECK(w[i] != -128, "int8_depthwise: weight ", i, " is -128; symmetric weights lie in [-127, 127]");
}

void check_shape(const Int8DepthwiseShape& s) {
  MG_CHECK(s.N >= 0 && s.C > 0 && s.H > 0 && s.W > 0 && s.K > 0 && s.stride > 0 && s.padding >= 0 && s.OH() > 0 &&
               s.OW() > 0,
           "int8_depthwise: invalid shape N ", s.N, " C ", s.C, " H ", s.H, " W ", s.W, " kernel ", s.K, " stride ",
           s.stride, " padding ", s.padding);
}

}  // namespace

const char* int8_depthwise_path() {
#if defined(__AVX2__)
  return "AVX2 (s16 products, s32 sums)";
#else
  return "scalar int32";
#endif
}

void int8_depthwise_ref(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w, int32_t* out) {
  check_shape(s);
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t nc = 0; nc < s.N * s.C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int32_t acc = 0;
        for (int64_t kh = 0; kh < s.K; ++kh)
          for (int64_t kw = 0; kw < s.K; ++kw) {
            const int64_t ih = oh * s.stride - s.padding + kh, iw = ow * s.stride - s.padding + kw;
            const int32_t xv = ih < 0 || ih >= s.H || iw < 0 || iw >= s.W ? zx : int32_t(x[(nc * s.H + ih) * s.W + iw]);
            acc += int32_t(w[((nc % s.C) * s.K + kh) * s.K + kw]) * (xv - zx);
          }
        out[(nc * OH + oh) * OW + ow] = acc;
      }
}

void int8_depthwise_i32(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w, int32_t* out) {
  check_shape(s);
  check_weights(s, w);
  const int64_t plane_in = s.H * s.W, plane_out = s.OH() * s.OW();
  parallel_for(0, s.N * s.C, 1, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> scratch;  // a padded plane and a row of sums: a few KiB per thread
    std::vector<int32_t> row_acc;
    for (int64_t nc = b; nc < e; ++nc)
      plane(s, x + nc * plane_in, zx, w + (nc % s.C) * s.K * s.K, out + nc * plane_out, scratch, row_acc);
  });
}

void int8_depthwise_f32(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w,
                        const float* scale, const float* bias, float clamp_lo, float clamp_hi, float* y) {
  check_shape(s);
  check_weights(s, w);
  const int64_t plane_in = s.H * s.W, plane_out = s.OH() * s.OW();
  parallel_for(0, s.N * s.C, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> acc(static_cast<size_t>(plane_out));  // one plane's sums (OH * OW * 4 bytes, per thread)
    std::vector<uint8_t> scratch;
    std::vector<int32_t> row_acc;
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t c = nc % s.C;
      plane(s, x + nc * plane_in, zx, w + c * s.K * s.K, acc.data(), scratch, row_acc);
      const float sc = scale[c], bi = bias ? bias[c] : 0.f;
      float* out = y + nc * plane_out;
      for (int64_t i = 0; i < plane_out; ++i)
        out[i] = std::min(std::max(std::fma(float(acc[size_t(i)]), sc, bi), clamp_lo), clamp_hi);
    }
  });
}

}  // namespace mg
