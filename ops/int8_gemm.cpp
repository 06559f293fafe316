// int8 GEMM: packing (A once per weight, B per call with the activation quantization fused in),
// one register-blocked micro-kernel per path (kMR rows x kNR columns of int32 accumulators), and
// the epilogue (zero-point correction, requantization to f32 with fma, clamp). Tiles of C are
// independent and each is summed in k order, so the result does not depend on the thread count.
// Path layout: A tiles [M/kMR][K/kG][kMR][kG] (repacked from the row-major weight once per call),
// B panels [N/kNR][K/kG][kNR][kG]; kG consecutive k values sit together because vpdpbusd sums 4
// byte products and vpmaddwd 2 word products per lane.
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

namespace mg {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define MG_INT8_VNNI 1
using AElem = int8_t;
using BElem = uint8_t;
constexpr int64_t kG = 4, kNR = 32, kMR = 8, kLanes = 16;
#elif defined(__AVX2__)
#define MG_INT8_AVX2 1
using AElem = int16_t;
using BElem = int16_t;
constexpr int64_t kG = 2, kNR = 16, kMR = 4, kLanes = 8;
#else
using AElem = int8_t;
using BElem = uint8_t;
constexpr int64_t kG = 4, kNR = 16, kMR = 4, kLanes = 16;
#endif

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Packed buffers are raw bytes (u8 tensors): the AVX2 path's s16 elements have no DType of their own.

// ---- micro-kernels: acc[r][j] = sum_k A[r][k] * B[k][j] over one A tile and one B panel -----------

#if defined(MG_INT8_VNNI)
void micro_kernel(const AElem* a, const BElem* b, int64_t kg, int32_t* acc) {
  __m512i c[kMR][2];
  for (int r = 0; r < kMR; ++r) c[r][0] = c[r][1] = _mm512_setzero_si512();
  for (int64_t kk = 0; kk < kg; ++kk) {
    const __m512i b0 = _mm512_loadu_si512(b + kk * kNR * kG);
    const __m512i b1 = _mm512_loadu_si512(b + kk * kNR * kG + 64);
    for (int r = 0; r < kMR; ++r) {
      int32_t w;
      std::memcpy(&w, a + (kk * kMR + r) * kG, 4);  // A[r][4kk..4kk+3], s8
      const __m512i av = _mm512_set1_epi32(w);
      c[r][0] = _mm512_dpbusd_epi32(c[r][0], b0, av);  // u8 activations x s8 weights, exact
      c[r][1] = _mm512_dpbusd_epi32(c[r][1], b1, av);
    }
  }
  for (int r = 0; r < kMR; ++r) {
    _mm512_storeu_si512(acc + r * kNR, c[r][0]);
    _mm512_storeu_si512(acc + r * kNR + 16, c[r][1]);
  }
}
#elif defined(MG_INT8_AVX2)
void micro_kernel(const AElem* a, const BElem* b, int64_t kg, int32_t* acc) {
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
#else
void micro_kernel(const AElem* a, const BElem* b, int64_t kg, int32_t* acc) {
  std::fill(acc, acc + kMR * kNR, 0);
  for (int64_t kk = 0; kk < kg; ++kk)
    for (int r = 0; r < kMR; ++r)
      for (int j = 0; j < kNR; ++j) {
        int32_t s = 0;
        for (int g = 0; g < kG; ++g) s += int32_t(a[(kk * kMR + r) * kG + g]) * int32_t(b[(kk * kNR + j) * kG + g]);
        acc[r * kNR + j] += s;
      }
}
#endif

// ---- B packing ------------------------------------------------------------------------------

// One element at a time: any layout, any tail. `value(k, n)` gives the u8 value as int32.
template <typename F>
void pack_b_scalar(BElem* panel, int64_t n0, int64_t j0, int64_t j1, int64_t K, int64_t N, int64_t kg, F value) {
  for (int64_t kk = 0; kk < kg; ++kk)
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t g = 0; g < kG; ++g) {
        const int64_t k = kk * kG + g, n = n0 + j;
        panel[(kk * kNR + j) * kG + g] = (k < K && n < N) ? BElem(value(k, n)) : BElem(0);
      }
}

#if defined(MG_INT8_VNNI) || defined(MG_INT8_AVX2)
// kLanes f32 values quantized to int32 lanes in [0, 255], the same arithmetic as quantize_u8.
#if defined(MG_INT8_VNNI)
inline __m512i quantize_lanes(const float* x, __m512 inv, __m512 zero) {
  __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm512_add_ps(r, zero);
  r = _mm512_min_ps(_mm512_max_ps(r, _mm512_setzero_ps()), _mm512_set1_ps(255.f));  // max(NaN, 0) = 0
  return _mm512_cvttps_epi32(r);
}
#else
inline __m256i quantize_lanes(const float* x, __m256 inv, __m256 zero) {
  __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm256_add_ps(r, zero);
  r = _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), _mm256_set1_ps(255.f));  // max(NaN, 0) = 0
  return _mm256_cvttps_epi32(r);
}
#endif

// kLanes columns [n, n + kLanes) that are contiguous in memory (one group, col_stride 1), all k.
void pack_b_lanes_f32(BElem* panel, int64_t j, const float* col0, int64_t row_stride, int64_t K, int64_t kg,
                      float inv_scale, int32_t zero) {
#if defined(MG_INT8_VNNI)
  const __m512 inv = _mm512_set1_ps(inv_scale), zf = _mm512_set1_ps(float(zero));
  for (int64_t kk = 0; kk < kg; ++kk) {
    __m512i word = _mm512_setzero_si512();
    for (int64_t g = 0; g < kG; ++g) {
      const int64_t k = kk * kG + g;
      if (k < K) word = _mm512_or_si512(word, _mm512_slli_epi32(quantize_lanes(col0 + k * row_stride, inv, zf), int(8 * g)));
    }
    _mm512_storeu_si512(panel + (kk * kNR + j) * kG, word);
  }
#else
  const __m256 inv = _mm256_set1_ps(inv_scale), zf = _mm256_set1_ps(float(zero));
  for (int64_t kk = 0; kk < kg; ++kk) {
    const int64_t k = kk * kG;
    __m256i word = quantize_lanes(col0 + k * row_stride, inv, zf);  // low s16: k, high s16: k + 1
    if (k + 1 < K) word = _mm256_or_si256(word, _mm256_slli_epi32(quantize_lanes(col0 + (k + 1) * row_stride, inv, zf), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (kk * kNR + j) * kG), word);
  }
#endif
}
#endif

// Packs B (K, N) into panels; `f32` set: quantize on the way, else copy u8 values.
Tensor pack_b(int64_t K, int64_t N, const float* f32, const uint8_t* u8, const Int8Layout& L, float inv_scale,
              int32_t zero, Device dev) {
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
      if (u8) {
        pack_b_scalar(panel, n0, 0, kNR, K, N, kg, [&](int64_t k, int64_t n) { return int32_t(u8[L.offset(k, n)]); });
        continue;
      }
      auto scalar = [&](int64_t k, int64_t n) { return int32_t(quantize_u8(f32[L.offset(k, n)], inv_scale, zero)); };
      for (int64_t j = 0; j < kNR; j += kLanes) {
        [[maybe_unused]] const int64_t n = n0 + j;
#if defined(MG_INT8_VNNI) || defined(MG_INT8_AVX2)
        if (L.col_stride == 1 && n + kLanes <= N && n / L.group == (n + kLanes - 1) / L.group) {
          pack_b_lanes_f32(panel, j, f32 + L.offset(0, n), L.row_stride, K, kg, inv_scale, zero);
          continue;
        }
#endif
        pack_b_scalar(panel, n0, j, j + kLanes, K, N, kg, scalar);
      }
    }
  });
  return packed;
}

// ---- epilogue -------------------------------------------------------------------------------

float requant(int32_t c, float scale, float bias, float lo, float hi) {
  return std::min(std::max(std::fma(float(c), scale, bias), lo), hi);
}

// Writes rows [m0, m0 + rows) x columns [n0, n0 + cols) of C from the raw tile `acc`. Column n's
// place (n / group, n % group) is stepped along, not divided out per element.
void epilogue(const Int8PackedA& a, const int32_t* acc, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
              int32_t b_zero, const Int8GemmOut& out) {
  const int32_t* sums = a.row_sums.data<int32_t>();
  const Int8Layout& L = out.layout;
  const int64_t g0 = n0 / L.group, p0 = n0 % L.group;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int32_t corr = b_zero * sums[m];
    const int32_t* row = acc + r * kNR;
    const int64_t base = m * L.row_stride;
    int64_t g = g0, p = p0, j = 0;
    if (out.i32) {
      for (; j < cols; ++j) {
        out.i32[base + g * L.group_stride + p * L.col_stride] = row[j] - corr;
        if (++p == L.group) p = 0, ++g;
      }
      continue;
    }
    const float s = out.row_scale[m], b = out.bias ? out.bias[m] : 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256i vc = _mm256_set1_epi32(corr);
    const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b), lo = _mm256_set1_ps(out.clamp_lo),
                 hi = _mm256_set1_ps(out.clamp_hi);
#endif
    while (j < cols) {
      float* dst = out.f32 + base + g * L.group_stride + p * L.col_stride;
#if defined(__AVX2__) && defined(__FMA__)
      if (L.col_stride == 1 && j + 8 <= cols && p + 8 <= L.group) {  // 8 contiguous outputs
        const __m256i c = _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j)), vc);
        const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), vs, vb);
        _mm256_storeu_ps(dst, _mm256_min_ps(_mm256_max_ps(v, lo), hi));
        j += 8;
        p += 8;
        if (p == L.group) p = 0, ++g;
        continue;
      }
#endif
      *dst = requant(row[j] - corr, s, b, out.clamp_lo, out.clamp_hi);
      ++j;
      if (++p == L.group) p = 0, ++g;
    }
  }
}

// A (M, K) row-major -> tiles [M/kMR][K/kG][kMR][kG] (rows past M and k past K zero), once per call.
void pack_a(const int8_t* a, int64_t M, int64_t K, AElem* dst) {
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

void run_gemm(const Int8PackedA& a, int64_t N, const Tensor& packed_b, int32_t b_zero, const Int8GemmOut& out) {
  const int64_t M = a.M, kg = round_up(a.K, kG) / kG;
  const int64_t mt = round_up(M, kMR) / kMR, nt = round_up(N, kNR) / kNR;
  const Device dev = packed_b.device();
  Tensor packed_a;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    packed_a = empty({mt * kg * kMR * kG * int64_t(sizeof(AElem)) + 1}, {.dtype = DType::u8, .device = dev});
  }
  AElem* ap = reinterpret_cast<AElem*>(packed_a.data_ptr());
  pack_a(a.data.data<int8_t>(), M, a.K, ap);
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
          micro_kernel(ap + q * kg * kMR * kG, bp + p * kg * kNR * kG, kg, acc);
          epilogue(a, acc, q * kMR, std::min(kMR, M - q * kMR), p * kNR, std::min(kNR, N - p * kNR), b_zero, out);
        }
  });
}

void check_out(const char* op, const Int8PackedA& a, const Int8GemmOut& out) {
  MG_CHECK(a.data.defined() && a.row_sums.defined(), op, ": A is not packed (call int8_pack_a)");
  MG_CHECK((out.i32 != nullptr) != (out.f32 != nullptr), op, ": exactly one of out.i32 and out.f32 must be set");
  MG_CHECK(out.i32 || out.row_scale, op, ": f32 output needs row_scale");
  MG_CHECK(out.layout.group > 0, op, ": output layout group must be positive, got ", out.layout.group);
}

}  // namespace

const char* int8_gemm_path() {
#if defined(MG_INT8_VNNI)
  return "AVX-512 VNNI (vpdpbusd)";
#elif defined(MG_INT8_AVX2)
  return "AVX2 (vpmaddwd on s16)";
#else
  return "scalar int32";
#endif
}

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
           "int8_pack_a: expected a contiguous 2-d i8 tensor on a cpu device, got ",
           a.defined() ? shape_str(a.shape()) : std::string("an undefined tensor"));
  Int8PackedA p;
  p.data = a;
  p.M = a.size(0);
  p.K = a.size(1);
  p.row_sums = zeros({p.M}, {.dtype = DType::i32, .device = a.device()});
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
  Tensor packed = pack_b(a.K, N, nullptr, b, b_layout, 1.f, b_zero, workspace_device);
  run_gemm(a, N, packed, b_zero, out);
}

void int8_gemm_quantize_b(const Int8PackedA& a, int64_t N, const float* b, const Int8Layout& b_layout,
                          float inv_scale, int32_t b_zero, const Int8GemmOut& out, Device workspace_device) {
  check_out("int8_gemm_quantize_b", a, out);
  MG_CHECK(N >= 0 && b_zero >= 0 && b_zero <= 255, "int8_gemm_quantize_b: bad N=", N, " or zero point ", b_zero);
  MG_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "int8_gemm_quantize_b: 1/scale must be finite and positive, got ",
           inv_scale);
  if (a.M == 0 || N == 0) return;
  Tensor packed = pack_b(a.K, N, b, nullptr, b_layout, inv_scale, b_zero, workspace_device);
  run_gemm(a, N, packed, b_zero, out);
}

}  // namespace mg
