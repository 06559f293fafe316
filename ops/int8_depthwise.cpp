// Int8 depthwise convolution kernels (ops/int8_depthwise.h). The work items are (channel, block of
// images): the block's planes of that channel are written, as s16 values x - zx, into one frame of
// zeros (the padding, which so contributes 0), the padded planes stacked vertically, each split
// into stride x stride phases: phase (a, b) holds padded rows a, a + S, ... and columns b, b + S,
// ... of every plane, with row pitch Wq = ceil(Wp / S) and Hq = ceil(Hp / S) rows per plane.
// Output (image i, oh, ow) then sits at the flat index f = (i * Hq + oh) * Wq + ow, and its tap
// (kh, kw) at f + (kh / S) * Wq + kw / S of phase (kh % S, kw % S): every tap is one contiguous
// load at a fixed offset from f, for any stride, and the flat loop runs over all f of the block
// (the few rows and columns past OH and OW are computed and dropped), so small planes (4x4, 8x8)
// keep the vectors full. Taps go two at a time: (x_t, x_t') interleaved s16 pairs times
// (w_t, w_t') summed into int32 lanes by vpmaddwd (AVX2) or vpdpwssd (AVX-512 VNNI);
// |x - zx| <= 255 and |w| <= 128, so nothing saturates. Scratch (the frame and its sums, ~50 KiB
// per thread) is std::vector, the one exception to allocator memory here: it is per-thread, small
// and freed at return.
#include "ops/int8_depthwise.h"

#include <algorithm>
#include <cstring>
#include <immintrin.h>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace mg {
namespace {

constexpr int64_t kMaxLanes = 32;

// The geometry shared by every work item of one call.
struct Plan {
  int64_t S, Hq, Wq, images, F, Fp, phase;  // images per block; F flat outputs; phase: s16 per phase
  int64_t pairs;                            // ceil(K * K / 2)
  std::vector<int64_t> off;                 // per tap (2 * pairs, the odd one out reads 0 with weight 0)
};

Plan make_plan(const Int8DepthwiseShape& s) {
  Plan p;
  p.S = s.stride;
  p.Hq = (s.H + 2 * s.padding + p.S - 1) / p.S;
  p.Wq = (s.W + 2 * s.padding + p.S - 1) / p.S;
  p.images = std::clamp<int64_t>(8192 / (p.Hq * p.Wq * p.S * p.S), 1, std::max<int64_t>(s.N, 1));
  p.F = p.images * p.Hq * p.Wq;
  p.Fp = (p.F + kMaxLanes - 1) / kMaxLanes * kMaxLanes;
  p.phase = p.Fp + ((s.K - 1) / p.S) * p.Wq + (s.K - 1) / p.S;
  p.pairs = (s.K * s.K + 1) / 2;
  p.off.assign(size_t(2 * p.pairs), 0);
  for (int64_t kh = 0; kh < s.K; ++kh)
    for (int64_t kw = 0; kw < s.K; ++kw)
      p.off[size_t(kh * s.K + kw)] = ((kh % p.S) * p.S + kw % p.S) * p.phase + (kh / p.S) * p.Wq + kw / p.S;
  return p;
}

// Weight pairs (w_2j, w_2j+1) as one int32 of two s16 (the odd tap out is 0).
void weight_pairs(const Int8DepthwiseShape& s, const int8_t* w, const Plan& p, int32_t* wp) {
  for (int64_t j = 0; j < p.pairs; ++j) {
    const int64_t t0 = 2 * j, t1 = 2 * j + 1;
    const int16_t a = w[t0], b = t1 < s.K * s.K ? int16_t(w[t1]) : int16_t(0);
    wp[j] = int32_t(uint32_t(uint16_t(a)) | (uint32_t(uint16_t(b)) << 16));
  }
}

// Writes x - zx of one plane (image i of the block) into the frame, whose padding stays 0.
void fill_frame(const Int8DepthwiseShape& s, const Plan& p, const uint8_t* x, int32_t zx, int64_t i, int16_t* frame) {
  for (int64_t h = 0; h < s.H; ++h) {
    const uint8_t* src = x + h * s.W;
    const int64_t r = h + s.padding;
    const int64_t row = (i * p.Hq + r / p.S) * p.Wq;
    if (p.S == 1) {
      int16_t* dst = frame + row + s.padding;
      for (int64_t w = 0; w < s.W; ++w) dst[w] = int16_t(int32_t(src[w]) - zx);
      continue;
    }
    for (int64_t b = 0; b < p.S; ++b) {  // column phase b: padded columns b, b + S, ...
      int16_t* dst = frame + ((r % p.S) * p.S + b) * p.phase + row;
      const int64_t first = b >= s.padding ? 0 : (s.padding - b + p.S - 1) / p.S;  // first q with q*S + b >= padding
      for (int64_t q = first, w = q * p.S + b - s.padding; w < s.W; ++q, w += p.S) dst[q] = int16_t(int32_t(src[w]) - zx);
    }
  }
}

// acc[f] = sum over taps of w_t * frame[off_t + f], f < Fp.
void sums_scalar(const Plan& p, const int16_t* frame, const int32_t* wp, int32_t* acc) {
  for (int64_t f = 0; f < p.Fp; ++f) {
    int32_t a = 0;
    for (int64_t j = 0; j < p.pairs; ++j) {
      const int32_t w0 = int16_t(uint32_t(wp[j]) & 0xffff), w1 = int16_t(uint32_t(wp[j]) >> 16);
      a += w0 * frame[p.off[size_t(2 * j)] + f] + w1 * frame[p.off[size_t(2 * j + 1)] + f];
    }
    acc[f] = a;
  }
}

__attribute__((target("avx2,fma"))) void sums_avx2(const Plan& p, const int16_t* frame, const int32_t* wp,
                                                    int32_t* acc) {
  for (int64_t f = 0; f < p.Fp; f += 16) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int64_t j = 0; j < p.pairs; ++j) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(frame + p.off[size_t(2 * j)] + f));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(frame + p.off[size_t(2 * j + 1)] + f));
      const __m256i w = _mm256_set1_epi32(wp[j]);
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));  // f+0..3, f+8..11
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));  // f+4..7, f+12..15
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + f), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + f + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void sums_vnni(const Plan& p, const int16_t* frame,
                                                                        const int32_t* wp, int32_t* acc) {
  // unpacklo/hi work per 128-bit block: lo holds f + {0-3, 8-11, 16-19, 24-27}, hi the rest
  const __m512i idx0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), idx1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  for (int64_t f = 0; f < p.Fp; f += 32) {
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int64_t j = 0; j < p.pairs; ++j) {
      const __m512i a = _mm512_loadu_si512(frame + p.off[size_t(2 * j)] + f);
      const __m512i b = _mm512_loadu_si512(frame + p.off[size_t(2 * j + 1)] + f);
      const __m512i w = _mm512_set1_epi32(wp[j]);
      lo = _mm512_dpwssd_epi32(lo, _mm512_unpacklo_epi16(a, b), w);
      hi = _mm512_dpwssd_epi32(hi, _mm512_unpackhi_epi16(a, b), w);
    }
    _mm512_storeu_si512(acc + f, _mm512_permutex2var_epi64(lo, idx0, hi));
    _mm512_storeu_si512(acc + f + 16, _mm512_permutex2var_epi64(lo, idx1, hi));
  }
}

void check_shape(const Int8DepthwiseShape& s) {
  MG_CHECK(s.N >= 0 && s.C > 0 && s.H > 0 && s.W > 0 && s.K > 0 && s.stride > 0 && s.padding >= 0 &&
               s.H + 2 * s.padding >= s.K && s.W + 2 * s.padding >= s.K,
           "int8_depthwise: invalid shape N ", s.N, " C ", s.C, " H ", s.H, " W ", s.W, " kernel ", s.K, " stride ",
           s.stride, " padding ", s.padding);
}

}  // namespace

const char* int8_depthwise_path() {
  switch (int8_isa()) {
    case Int8Isa::avx512vnni: return "AVX-512 VNNI (vpdpwssd)";
    case Int8Isa::avx2: return "AVX2 (vpmaddwd)";
    case Int8Isa::scalar: break;
  }
  return "scalar int32";
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

void int8_depthwise(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w,
                    const Int8DepthwiseOut& out) {
  check_shape(s);
  MG_CHECK(zx >= 0 && zx <= 255, "int8_depthwise: zero point ", zx, " is outside [0, 255]");
  MG_CHECK((out.i32 != nullptr) + (out.f32 != nullptr) + (out.u8 != nullptr) == 1,
           "int8_depthwise: exactly one of out.i32, out.f32 and out.u8 must be set");
  MG_CHECK(out.i32 || out.scale, "int8_depthwise: f32 and u8 output need per-channel scales");
  if (s.N == 0) return;
  const Plan p = make_plan(s);
  const Int8Isa isa = int8_isa();
  const int64_t OH = s.OH(), OW = s.OW(), plane_in = s.H * s.W, plane_out = OH * OW;
  const int64_t blocks = (s.N + p.images - 1) / p.images;
  parallel_for(0, s.C * blocks, 1, [&](int64_t b, int64_t e) {
    std::vector<int16_t> frame(size_t(p.S * p.S * p.phase + kMaxLanes), 0);  // padding stays 0 for every block
    std::vector<int32_t> acc(size_t(p.Fp)), wp(size_t(p.pairs));
    for (int64_t item = b; item < e; ++item) {
      const int64_t c = item / blocks, n0 = (item % blocks) * p.images, nb = std::min(p.images, s.N - n0);
      for (int64_t i = 0; i < nb; ++i) fill_frame(s, p, x + ((n0 + i) * s.C + c) * plane_in, zx, i, frame.data());
      weight_pairs(s, w + c * s.K * s.K, p, wp.data());
      if (isa == Int8Isa::avx512vnni) sums_vnni(p, frame.data(), wp.data(), acc.data());
      else if (isa == Int8Isa::avx2) sums_avx2(p, frame.data(), wp.data(), acc.data());
      else sums_scalar(p, frame.data(), wp.data(), acc.data());
      Requant q = out.q;
      if (!out.i32) q.scale = out.scale[c], q.bias = out.bias ? out.bias[c] : 0.f;
      for (int64_t i = 0; i < nb; ++i)
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int32_t* row = acc.data() + (i * p.Hq + oh) * p.Wq;
          const int64_t o = ((n0 + i) * s.C + c) * plane_out + oh * OW;
          if (out.i32) std::memcpy(out.i32 + o, row, size_t(OW) * sizeof(int32_t));
          else if (out.f32) requant_row_f32(row, OW, 0, q, out.f32 + o);
          else requant_row_u8(row, OW, 0, q, out.u8 + o);
        }
    }
  });
}

}  // namespace mg
