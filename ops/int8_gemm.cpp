// int8 GEMM: packing (A once per call from the row-major weight, B per call with the activation
// quantization fused in, or copied from u8 activations), one register-blocked micro-kernel per
// path (kMR rows x kNR columns of int32 accumulators), and the epilogue (zero-point correction,
// requantization to f32 or u8, ops/int8_requant.h). Tiles of C are independent and each is summed
// in k order, so the result does not depend on the thread count. The path is chosen at run time
// (ops/int8_isa.h): each is a traits struct whose SIMD functions carry their own target
// attribute, and the drivers are templates over it.
// Path layout: A tiles [M/kMR][K/kG][kMR][kG], B panels [N/kNR][K/kG][kNR][kG]; kG consecutive k
// values sit together because vpdpbusd sums 4 byte products and vpmaddwd 2 word products per lane.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
// GCC 12 false positive on _mm512_undefined_ps() inside AVX-512 intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "ops/int8_gemm.h"

#include <algorithm>
#include <cstring>
#include <immintrin.h>

#include "core/error.h"
#include "core/memory_category.h"
#include "core/parallel.h"
#include "ops/cuda/int8_launchers.h"
#include "ops/int8_isa.h"

#define MG_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define MG_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace mg {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Packed buffers are raw bytes (u8 tensors): the AVX2 path's s16 elements have no DType of their own.

// ---- the paths: tile sizes, micro-kernel acc[r][j] = sum_k A[r][k] * B[k][j], lane packers -----

// u8 activations x s8 weights with vpdpbusd, exact.
struct Vnni {
  using AElem = int8_t;
  using BElem = uint8_t;
  static constexpr int64_t kG = 4, kNR = 32, kMR = 8, kLanes = 16;
  static constexpr bool kSimd = true;

  MG_TARGET_VNNI static void micro_kernel(const AElem* a, const BElem* b, int64_t kg, int32_t* acc) {
    __m512i c[kMR][2];
    for (int r = 0; r < kMR; ++r) c[r][0] = c[r][1] = _mm512_setzero_si512();
    for (int64_t kk = 0; kk < kg; ++kk) {
      const __m512i b0 = _mm512_loadu_si512(b + kk * kNR * kG);
      const __m512i b1 = _mm512_loadu_si512(b + kk * kNR * kG + 64);
      for (int r = 0; r < kMR; ++r) {
        int32_t w;
        std::memcpy(&w, a + (kk * kMR + r) * kG, 4);  // A[r][4kk..4kk+3], s8
        const __m512i av = _mm512_set1_epi32(w);
        c[r][0] = _mm512_dpbusd_epi32(c[r][0], b0, av);
        c[r][1] = _mm512_dpbusd_epi32(c[r][1], b1, av);
      }
    }
    for (int r = 0; r < kMR; ++r) {
      _mm512_storeu_si512(acc + r * kNR, c[r][0]);
      _mm512_storeu_si512(acc + r * kNR + 16, c[r][1]);
    }
  }

  // kLanes f32 values quantized to int32 lanes in [0, 255], the arithmetic of quantize_u8.
  MG_TARGET_VNNI static __m512i quantize_lanes(const float* x, __m512 inv, __m512 zero) {
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_add_ps(r, zero);
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_setzero_ps()), _mm512_set1_ps(255.f));  // max(NaN, 0) = 0
    return _mm512_cvttps_epi32(r);
  }

  // kLanes columns at col0 (contiguous, one group), every k, into the panel at column j.
  MG_TARGET_VNNI static void pack_lanes_f32(BElem* panel, int64_t j, const float* col0, int64_t row_stride, int64_t K,
                                            int64_t kg, float inv_scale, int32_t zero) {
    const __m512 inv = _mm512_set1_ps(inv_scale), zf = _mm512_set1_ps(float(zero));
    for (int64_t kk = 0; kk < kg; ++kk) {
      __m512i word = _mm512_setzero_si512();
      for (int64_t g = 0; g < kG; ++g) {
        const int64_t k = kk * kG + g;
        if (k < K)
          word = _mm512_or_si512(word, _mm512_slli_epi32(quantize_lanes(col0 + k * row_stride, inv, zf), int(8 * g)));
      }
      _mm512_storeu_si512(panel + (kk * kNR + j) * kG, word);
    }
  }

  // The same from u8: four rows of 16 bytes interleaved into 16 words of (k, k+1, k+2, k+3).
  MG_TARGET_VNNI static void pack_lanes_u8(BElem* panel, int64_t j, const uint8_t* col0, int64_t row_stride, int64_t K,
                                           int64_t kg) {
    for (int64_t kk = 0; kk < kg; ++kk) {
      __m128i r[4];
      for (int64_t g = 0; g < 4; ++g) {
        const int64_t k = kk * 4 + g;
        r[g] = k < K ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(col0 + k * row_stride)) : _mm_setzero_si128();
      }
      const __m128i t0 = _mm_unpacklo_epi8(r[0], r[1]), t1 = _mm_unpackhi_epi8(r[0], r[1]);
      const __m128i t2 = _mm_unpacklo_epi8(r[2], r[3]), t3 = _mm_unpackhi_epi8(r[2], r[3]);
      __m128i* dst = reinterpret_cast<__m128i*>(panel + (kk * kNR + j) * kG);
      _mm_storeu_si128(dst + 0, _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128(dst + 2, _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128(dst + 3, _mm_unpackhi_epi16(t1, t3));
    }
  }
};

// Both operands widened to s16 at packing, vpmaddwd (vpmaddubsw would saturate at 255*127*2 > 32767).
struct Avx2 {
  using AElem = int16_t;
  using BElem = int16_t;
  static constexpr int64_t kG = 2, kNR = 16, kMR = 4, kLanes = 8;
  static constexpr bool kSimd = true;

  MG_TARGET_AVX2 static void micro_kernel(const AElem* a, const BElem* b, int64_t kg, int32_t* acc) {
    __m256i c[kMR][2];
    for (int r = 0; r < kMR; ++r) c[r][0] = c[r][1] = _mm256_setzero_si256();
    for (int64_t kk = 0; kk < kg; ++kk) {
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kk * kNR * kG));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kk * kNR * kG + 16));
      for (int r = 0; r < kMR; ++r) {
        int32_t w;
        std::memcpy(&w, a + (kk * kMR + r) * kG, 4);  // (A[r][2kk], A[r][2kk+1]) as two s16
        const __m256i av = _mm256_set1_epi32(w);
        // s16 x s16 pairs summed into s32: |255 * 128| * 2 fits easily, so no saturation.
        c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(av, b0));
        c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(av, b1));
      }
    }
    for (int r = 0; r < kMR; ++r) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * kNR), c[r][0]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * kNR + 8), c[r][1]);
    }
  }

  MG_TARGET_AVX2 static __m256i quantize_lanes(const float* x, __m256 inv, __m256 zero) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_add_ps(r, zero);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), _mm256_set1_ps(255.f));  // max(NaN, 0) = 0
    return _mm256_cvttps_epi32(r);
  }

  MG_TARGET_AVX2 static void pack_lanes_f32(BElem* panel, int64_t j, const float* col0, int64_t row_stride, int64_t K,
                                            int64_t kg, float inv_scale, int32_t zero) {
    const __m256 inv = _mm256_set1_ps(inv_scale), zf = _mm256_set1_ps(float(zero));
    for (int64_t kk = 0; kk < kg; ++kk) {
      const int64_t k = kk * kG;
      __m256i word = quantize_lanes(col0 + k * row_stride, inv, zf);  // low s16: k, high s16: k + 1
      if (k + 1 < K)
        word = _mm256_or_si256(word, _mm256_slli_epi32(quantize_lanes(col0 + (k + 1) * row_stride, inv, zf), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (kk * kNR + j) * kG), word);
    }
  }

  // Two rows of 8 bytes widened to s16 and interleaved into 8 words of (k, k+1).
  MG_TARGET_AVX2 static void pack_lanes_u8(BElem* panel, int64_t j, const uint8_t* col0, int64_t row_stride, int64_t K,
                                           int64_t kg) {
    for (int64_t kk = 0; kk < kg; ++kk) {
      const int64_t k = kk * 2;
      const __m128i a = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(col0 + k * row_stride)));
      const __m128i b = k + 1 < K
                            ? _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(col0 + (k + 1) * row_stride)))
                            : _mm_setzero_si128();
      __m128i* dst = reinterpret_cast<__m128i*>(panel + (kk * kNR + j) * kG);
      _mm_storeu_si128(dst + 0, _mm_unpacklo_epi16(a, b));
      _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(a, b));
    }
  }
};

struct Scalar {
  using AElem = int8_t;
  using BElem = uint8_t;
  static constexpr int64_t kG = 4, kNR = 16, kMR = 4, kLanes = 16;
  static constexpr bool kSimd = false;

  static void micro_kernel(const AElem* a, const BElem* b, int64_t kg, int32_t* acc) {
    std::fill(acc, acc + kMR * kNR, 0);
    for (int64_t kk = 0; kk < kg; ++kk)
      for (int r = 0; r < kMR; ++r)
        for (int j = 0; j < kNR; ++j) {
          int32_t s = 0;
          for (int g = 0; g < kG; ++g)
            s += int32_t(a[(kk * kMR + r) * kG + g]) * int32_t(b[(kk * kNR + j) * kG + g]);
          acc[r * kNR + j] += s;
        }
  }
  static void pack_lanes_f32(BElem*, int64_t, const float*, int64_t, int64_t, int64_t, float, int32_t) {}
  static void pack_lanes_u8(BElem*, int64_t, const uint8_t*, int64_t, int64_t, int64_t) {}
};

// ---- B packing ------------------------------------------------------------------------------

// One element at a time: any layout, any tail. `value(k, n)` gives the u8 value as int32.
template <class P, typename F>
void pack_b_scalar(typename P::BElem* panel, int64_t n0, int64_t j0, int64_t j1, int64_t K, int64_t N, int64_t kg,
                   F value) {
  for (int64_t kk = 0; kk < kg; ++kk)
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t g = 0; g < P::kG; ++g) {
        const int64_t k = kk * P::kG + g, n = n0 + j;
        panel[(kk * P::kNR + j) * P::kG + g] = (k < K && n < N) ? typename P::BElem(value(k, n)) : typename P::BElem(0);
      }
}

// Packs B (K, N) into panels: `f32` set: quantize on the way, else copy the u8 values.
template <class P>
Tensor pack_b(int64_t K, int64_t N, const float* f32, const uint8_t* u8, const Int8Layout& L, float inv_scale,
              int32_t zero, Device dev) {
  using BElem = typename P::BElem;
  constexpr int64_t kG = P::kG, kNR = P::kNR, kLanes = P::kLanes;
  const int64_t kg = round_up(K, kG) / kG, nt = round_up(N, kNR) / kNR;
  Tensor packed;
  {
    MemoryCategoryGuard cat(MemoryCategory::workspace);
    packed = empty({nt * kg * kNR * kG * int64_t(sizeof(BElem))}, {.dtype = DType::u8, .device = dev});  // all written
  }
  BElem* base = static_cast<BElem*>(packed.data_ptr());
  parallel_for(0, nt, std::max<int64_t>(1, 8192 / std::max<int64_t>(kg * kNR * kG, 1)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      BElem* panel = base + t * kg * kNR * kG;
      const int64_t n0 = t * kNR;
      for (int64_t j = 0; j < kNR; j += kLanes) {
        const int64_t n = n0 + j;
        if (P::kSimd && L.col_stride == 1 && n + kLanes <= N && n / L.group == (n + kLanes - 1) / L.group) {
          if (u8) P::pack_lanes_u8(panel, j, u8 + L.offset(0, n), L.row_stride, K, kg);
          else P::pack_lanes_f32(panel, j, f32 + L.offset(0, n), L.row_stride, K, kg, inv_scale, zero);
          continue;
        }
        if (u8)
          pack_b_scalar<P>(panel, n0, j, j + kLanes, K, N, kg, [&](int64_t k, int64_t nn) { return int32_t(u8[L.offset(k, nn)]); });
        else
          pack_b_scalar<P>(panel, n0, j, j + kLanes, K, N, kg, [&](int64_t k, int64_t nn) {
            return int32_t(quantize_u8(f32[L.offset(k, nn)], inv_scale, zero));
          });
      }
    }
  });
  return packed;
}

// ---- epilogue -------------------------------------------------------------------------------

// Writes rows [m0, m0 + rows) x columns [n0, n0 + cols) of C from the raw tile `acc`. Column n's
// place (n / group, n % group) is stepped along, not divided out per element; with col_stride 1
// each run of columns inside one group is contiguous and goes through the row requantizers.
template <class P>
void epilogue(const Int8PackedA& a, const int32_t* acc, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
              int32_t b_zero, const Int8GemmOut& out) {
  const int32_t* sums = a.row_sums.data<int32_t>();
  const Int8Layout& L = out.layout;
  const int64_t g0 = n0 / L.group, p0 = n0 % L.group;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int32_t corr = b_zero * sums[m];
    const int32_t* row = acc + r * P::kNR;
    const int64_t base = m * L.row_stride;
    Requant q;
    if (!out.i32)
      q = {.scale = out.row_scale[m], .bias = out.bias ? out.bias[m] : 0.f, .lo = out.clamp_lo, .hi = out.clamp_hi,
           .out_inv_scale = out.out_inv_scale, .out_zero = out.out_zero};
    int64_t g = g0, p = p0, j = 0;
    while (j < cols) {
      const int64_t at = base + g * L.group_stride + p * L.col_stride;
      const int64_t run = L.col_stride == 1 ? std::min(cols - j, L.group - p) : 1;
      if (out.i32) {
        for (int64_t i = 0; i < run; ++i) out.i32[at + i * L.col_stride] = row[j + i] - corr;
      } else if (out.f32) {
        requant_row_f32(row + j, run, corr, q, out.f32 + at);
      } else {
        requant_row_u8(row + j, run, corr, q, out.u8 + at);
      }
      j += run;
      p += run;
      if (p == L.group) p = 0, ++g;
    }
  }
}

// A (M, K) row-major -> tiles [M/kMR][K/kG][kMR][kG] (rows past M and k past K zero), once per call.
template <class P>
void pack_a(const int8_t* a, int64_t M, int64_t K, typename P::AElem* dst) {
  using AElem = typename P::AElem;
  constexpr int64_t kG = P::kG, kMR = P::kMR;
  const int64_t kg = round_up(K, kG) / kG, mt = round_up(M, kMR) / kMR, full = K / kG;
  parallel_for(0, mt, 4, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      AElem* tile = dst + q * kg * kMR * kG;
      for (int64_t r = 0; r < kMR; ++r) {
        const int64_t m = q * kMR + r;
        if (m >= M) {
          for (int64_t kk = 0; kk < kg; ++kk)
            for (int64_t g = 0; g < kG; ++g) tile[(kk * kMR + r) * kG + g] = 0;
          continue;
        }
        const int8_t* row = a + m * K;
        for (int64_t kk = 0; kk < full; ++kk)
          for (int64_t g = 0; g < kG; ++g) tile[(kk * kMR + r) * kG + g] = AElem(row[kk * kG + g]);
        for (int64_t kk = full; kk < kg; ++kk)
          for (int64_t g = 0; g < kG; ++g) {
            const int64_t k = kk * kG + g;
            tile[(kk * kMR + r) * kG + g] = k < K ? AElem(row[k]) : AElem(0);
          }
      }
    }
  });
}

// Packs A and B for path P, runs every tile, writes the epilogue.
template <class P>
void run_gemm(const Int8PackedA& a, int64_t N, const float* f32, const uint8_t* u8, const Int8Layout& b_layout,
              float inv_scale, int32_t b_zero, const Int8GemmOut& out, Device dev) {
  using AElem = typename P::AElem;
  using BElem = typename P::BElem;
  constexpr int64_t kG = P::kG, kNR = P::kNR, kMR = P::kMR;
  const Tensor packed_b = pack_b<P>(a.K, N, f32, u8, b_layout, inv_scale, b_zero, dev);
  const int64_t M = a.M, kg = round_up(a.K, kG) / kG;
  const int64_t mt = round_up(M, kMR) / kMR, nt = round_up(N, kNR) / kNR;
  Tensor packed_a;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    packed_a = empty({mt * kg * kMR * kG * int64_t(sizeof(AElem)) + 1}, {.dtype = DType::u8, .device = dev});
  }
  AElem* ap = reinterpret_cast<AElem*>(packed_a.data_ptr());
  pack_a<P>(a.data.data<int8_t>(), M, a.K, ap);
  const BElem* bp = static_cast<const BElem*>(packed_b.data_ptr());
  // Blocks of panels whose packed B (~128 KiB) stays in L2 while every A tile passes over it.
  const int64_t panel_bytes = std::max<int64_t>(kg * kNR * kG * int64_t(sizeof(BElem)), 1);
  const int64_t block = std::max<int64_t>(1, (int64_t(128) << 10) / panel_bytes);
  const int64_t blocks = (nt + block - 1) / block;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) int32_t acc[kMR * kNR];
    for (int64_t blk = b0; blk < b1; ++blk)
      for (int64_t q = 0; q < mt; ++q)
        for (int64_t p = blk * block; p < std::min(nt, (blk + 1) * block); ++p) {
          P::micro_kernel(ap + q * kg * kMR * kG, bp + p * kg * kNR * kG, kg, acc);
          epilogue<P>(a, acc, q * kMR, std::min(kMR, M - q * kMR), p * kNR, std::min(kNR, N - p * kNR), b_zero, out);
        }
  });
}

// A on cuda:N runs the CUDA kernel (ops/cuda/int8_gemm.cu, no workspace); else the CPU's best path.
void dispatch(const Int8PackedA& a, int64_t N, const float* f32, const uint8_t* u8, const Int8Layout& b_layout,
              float inv_scale, int32_t b_zero, const Int8GemmOut& out, Device dev) {
  if (a.data.device().is_cuda())
    return cuda::int8_gemm(a.data.device().index, a.M, N, a.K, a.data.data<int8_t>(), a.row_sums.data<int32_t>(), u8,
                           f32, b_layout, inv_scale, b_zero, out);
  switch (int8_isa()) {
    case Int8Isa::avx512vnni: return run_gemm<Vnni>(a, N, f32, u8, b_layout, inv_scale, b_zero, out, dev);
    case Int8Isa::avx2: return run_gemm<Avx2>(a, N, f32, u8, b_layout, inv_scale, b_zero, out, dev);
    case Int8Isa::scalar: return run_gemm<Scalar>(a, N, f32, u8, b_layout, inv_scale, b_zero, out, dev);
  }
}

void check_out(const char* op, const Int8PackedA& a, const Int8GemmOut& out) {
  MG_CHECK(a.data.defined() && a.row_sums.defined(), op, ": A is not packed (call int8_pack_a)");
  MG_CHECK((out.i32 != nullptr) + (out.f32 != nullptr) + (out.u8 != nullptr) == 1, op,
           ": exactly one of out.i32, out.f32 and out.u8 must be set");
  MG_CHECK(out.i32 || out.row_scale, op, ": f32 and u8 output need row_scale");
  MG_CHECK(!out.u8 || (std::isfinite(out.out_inv_scale) && out.out_inv_scale > 0 && out.out_zero >= 0 &&
                       out.out_zero <= 255),
           op, ": u8 output needs a positive finite 1/scale and a zero point in [0, 255]");
  MG_CHECK(out.layout.group > 0, op, ": output layout group must be positive, got ", out.layout.group);
}

}  // namespace

const char* int8_gemm_path() {
  switch (int8_isa()) {
    case Int8Isa::avx512vnni: return "AVX-512 VNNI (vpdpbusd)";
    case Int8Isa::avx2: return "AVX2 (vpmaddwd on s16)";
    case Int8Isa::scalar: break;
  }
  return "scalar int32";
}

const char* int8_gemm_cuda_path() { return "CUDA dp4a tiled kernel (64x64 tiles, sm_61+)"; }

void int8_gemm_ref(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda, const uint8_t* B, int64_t ldb,
                   int32_t b_zero, int32_t* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int32_t(A[m * lda + k]) * (int32_t(B[k * ldb + n]) - b_zero);
      C[m * ldc + n] = s;
    }
}

Int8PackedA int8_pack_a(const Tensor& a) {
  MG_CHECK(a.defined() && a.dtype() == DType::i8 && a.dim() == 2 && (a.numel() == 0 || a.is_contiguous()) && !a.is_meta(),
           "int8_pack_a: expected a contiguous 2-d i8 tensor on a cpu or cuda device, got ",
           a.defined() ? shape_str(a.shape()) : std::string("an undefined tensor"));
  Int8PackedA p;
  p.data = a;
  p.M = a.size(0);
  p.K = a.size(1);
  p.row_sums = zeros({p.M}, {.dtype = DType::i32, .device = a.device()});
  if (a.device().is_cuda()) {
    cuda::int8_row_sums(a.device().index, a.data<int8_t>(), p.M, p.K, p.row_sums.data<int32_t>());
    return p;
  }
  const int8_t* src = a.data<int8_t>();
  int32_t* sums = p.row_sums.data<int32_t>();
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t k = 0; k < p.K; ++k) sums[m] += src[m * p.K + k];
  return p;
}

void int8_gemm(const Int8PackedA& a, int64_t N, const uint8_t* b, const Int8Layout& b_layout, int32_t b_zero,
               const Int8GemmOut& out, Device workspace_device) {
  check_out("int8_gemm", a, out);
  MG_CHECK(N >= 0 && b_zero >= 0 && b_zero <= 255, "int8_gemm: bad N=", N, " or zero point ", b_zero);
  if (a.M == 0 || N == 0) return;
  dispatch(a, N, nullptr, b, b_layout, 1.f, b_zero, out, workspace_device);
}

void int8_gemm_quantize_b(const Int8PackedA& a, int64_t N, const float* b, const Int8Layout& b_layout,
                          float inv_scale, int32_t b_zero, const Int8GemmOut& out, Device workspace_device) {
  check_out("int8_gemm_quantize_b", a, out);
  MG_CHECK(N >= 0 && b_zero >= 0 && b_zero <= 255, "int8_gemm_quantize_b: bad N=", N, " or zero point ", b_zero);
  MG_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "int8_gemm_quantize_b: 1/scale must be finite and positive, got ",
           inv_scale);
  if (a.M == 0 || N == 0) return;
  dispatch(a, N, b, nullptr, b_layout, inv_scale, b_zero, out, workspace_device);
}

}  // namespace mg
