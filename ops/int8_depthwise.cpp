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
#include "ops/cuda/int8_launchers.h"

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

// dst[k] = src[k] - z, k < n (SSE2, which every x86-64 has, 16 at a time).
void widen_row(const uint8_t* src, int64_t n, int16_t z, int16_t* dst) {
  int64_t k = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128(), vz = _mm_set1_epi16(z);
  for (; k + 16 <= n; k += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k), _mm_sub_epi16(_mm_unpacklo_epi8(v, zero), vz));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k + 8), _mm_sub_epi16(_mm_unpackhi_epi8(v, zero), vz));
  }
  for (; k + 8 <= n; k += 8) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + k));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k), _mm_sub_epi16(_mm_unpacklo_epi8(v, zero), vz));
  }
#endif
  for (; k < n; ++k) dst[k] = int16_t(int16_t(src[k]) - z);
}

// even[k] = src[2k] - z, odd[k] = src[2k + 1] - z for 2k (+ 1) < n.
void split_row(const uint8_t* src, int64_t n, int16_t z, int16_t* even, int16_t* odd) {
  int64_t k = 0;
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi16(0xff), vz = _mm_set1_epi16(z);
  for (; 2 * k + 16 <= n; k += 8) {  // 16 bytes = 8 words (src[2k], src[2k + 1])
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * k));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(even + k), _mm_sub_epi16(_mm_and_si128(v, low), vz));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(odd + k), _mm_sub_epi16(_mm_srli_epi16(v, 8), vz));
  }
#endif
  for (; 2 * k < n; ++k) {
    even[k] = int16_t(int16_t(src[2 * k]) - z);
    if (2 * k + 1 < n) odd[k] = int16_t(int16_t(src[2 * k + 1]) - z);
  }
}

// Writes x - zx of one plane (image i of the block) into the frame, whose padding stays 0.
void fill_frame(const Int8DepthwiseShape& s, const Plan& p, const uint8_t* x, int32_t zx, int64_t i, int16_t* frame) {
  const int16_t z = int16_t(zx);
  if (p.S == 1) {
    for (int64_t h = 0; h < s.H; ++h) widen_row(x + h * s.W, s.W, z, frame + (i * p.Hq + h + s.padding) * p.Wq + s.padding);
    return;
  }
  for (int64_t h = 0; h < s.H; ++h) {
    const uint8_t* src = x + h * s.W;
    const int64_t r = h + s.padding, row = (i * p.Hq + r / p.S) * p.Wq;
    // element w = S k + e lies in padded column c = w + P: phase c % S, place c / S = k + (e + P) / S
    auto dst = [&](int64_t e) {
      return frame + ((r % p.S) * p.S + (e + s.padding) % p.S) * p.phase + row + (e + s.padding) / p.S;
    };
    if (p.S == 2) {
      split_row(src, s.W, z, dst(0), dst(1));
      continue;
    }
    for (int64_t e = 0; e < p.S; ++e) {
      int16_t* d = dst(e);
      for (int64_t k = 0, w = e; w < s.W; ++k, w += p.S) d[k] = int16_t(int16_t(src[w]) - z);
    }
  }
}

// Copies n bytes that are few (a row of a narrow output), without a library call per row.
void copy_small(void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (; n >= 16; n -= 16, d += 16, s += 16) std::memcpy(d, s, 16);
  if (n >= 8) std::memcpy(d, s, 8), n -= 8, d += 8, s += 8;
  if (n >= 4) std::memcpy(d, s, 4), n -= 4, d += 4, s += 4;
  while (n--) *d++ = *s++;
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
                    const Int8DepthwiseOut& out, Device device) {
  check_shape(s);
  MG_CHECK(zx >= 0 && zx <= 255, "int8_depthwise: zero point ", zx, " is outside [0, 255]");
  MG_CHECK((out.i32 != nullptr) + (out.f32 != nullptr) + (out.u8 != nullptr) == 1,
           "int8_depthwise: exactly one of out.i32, out.f32 and out.u8 must be set");
  MG_CHECK(out.i32 || out.scale, "int8_depthwise: f32 and u8 output need per-channel scales");
  if (s.N == 0) return;
  if (device.is_cuda()) return cuda::int8_depthwise(device.index, s, x, zx, w, out);
  MG_CHECK(device.is_cpu(), "int8_depthwise: expected a cpu or cuda device, got ", device.str());
  const Plan p = make_plan(s);
  const Int8Isa isa = int8_isa();
  const int64_t OH = s.OH(), OW = s.OW(), plane_in = s.H * s.W, plane_out = OH * OW;
  const int64_t blocks = (s.N + p.images - 1) / p.images, items = s.C * blocks;
  // Narrow outputs (OW < 16) requantize the whole flat block with full vectors, then copy the rows out.
  const bool flat_epilogue = !out.i32 && OW < 16;
  parallel_for(0, items, std::max<int64_t>(1, items / 32), [&](int64_t b, int64_t e) {
    std::vector<int16_t> frame(size_t(p.S * p.S * p.phase + kMaxLanes), 0);  // padding stays 0 for every block
    std::vector<int32_t> acc(size_t(p.Fp)), wp(size_t(p.pairs));
    std::vector<float> flat_f32(flat_epilogue && out.f32 ? size_t(p.Fp) : 0);
    std::vector<uint8_t> flat_u8(flat_epilogue && out.u8 ? size_t(p.Fp) : 0);
    for (int64_t item = b; item < e; ++item) {
      const int64_t c = item / blocks, n0 = (item % blocks) * p.images, nb = std::min(p.images, s.N - n0);
      for (int64_t i = 0; i < nb; ++i) fill_frame(s, p, x + ((n0 + i) * s.C + c) * plane_in, zx, i, frame.data());
      weight_pairs(s, w + c * s.K * s.K, p, wp.data());
      if (isa == Int8Isa::avx512vnni) sums_vnni(p, frame.data(), wp.data(), acc.data());
      else if (isa == Int8Isa::avx2) sums_avx2(p, frame.data(), wp.data(), acc.data());
      else sums_scalar(p, frame.data(), wp.data(), acc.data());
      Requant q = out.q;
      if (!out.i32) q.scale = out.scale[c], q.bias = out.bias ? out.bias[c] : 0.f;
      const int64_t used = nb * p.Hq * p.Wq;
      if (flat_epilogue && out.f32) requant_row_f32(acc.data(), used, 0, q, flat_f32.data());
      if (flat_epilogue && out.u8) requant_row_u8(acc.data(), used, 0, q, flat_u8.data());
      for (int64_t i = 0; i < nb; ++i)
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t f = (i * p.Hq + oh) * p.Wq;
          const int64_t o = ((n0 + i) * s.C + c) * plane_out + oh * OW;
          if (out.i32) std::memcpy(out.i32 + o, acc.data() + f, size_t(OW) * sizeof(int32_t));
          else if (flat_epilogue && out.f32) copy_small(out.f32 + o, flat_f32.data() + f, size_t(OW) * sizeof(float));
          else if (flat_epilogue) copy_small(out.u8 + o, flat_u8.data() + f, size_t(OW));
          else if (out.f32) requant_row_f32(acc.data() + f, OW, 0, q, out.f32 + o);
          else requant_row_u8(acc.data() + f, OW, 0, q, out.u8 + o);
        }
    }
  });
}

}  // namespace mg
