// The bitmask sparse x dense GEMM (see sparse_gemm.h). Each path is one function compiled for its
// instruction set with a target attribute, so a build for a plain AVX2 machine still holds the
// AVX-512 path and the cpuid check decides at runtime. Rows of W are split over threads; every
// output element is summed by one thread in ascending k, so the result is independent of the
// thread count.
#include "ops/sparse_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "core/parallel.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MG_SPARSE_X86 1
#endif

namespace mg {
namespace {

constexpr int64_t kTile = 64;  // columns of X^T per register tile
constexpr int64_t kPad = 16;   // M is padded to a multiple of this (the narrow tile)
constexpr int64_t kChunk = 56;  // bits read per 64-bit load (any bit offset within a byte leaves >= 57)

// What every path reads: W as bitmask + values + row offsets, X^T (K, Mp), Y^T (N, Mp).
struct Problem {
  const uint8_t* bits;
  int64_t nbytes;
  const float* values;
  const int64_t* offsets;
  int64_t N, K, Mp;
  const float* xt;
  float* yt;
};

// Bits [bit, bit + n) of the mask (n <= 56) as the low bits of a word.
inline uint64_t bit_chunk(const uint8_t* bits, int64_t nbytes, int64_t bit, int64_t n) {
  const int64_t byte = bit >> 3;
  uint64_t word = 0;
  if (byte + 8 <= nbytes) std::memcpy(&word, bits + byte, 8);
  else std::memcpy(&word, bits + byte, size_t(std::min<int64_t>(8, nbytes - byte)));
  word >>= (bit & 7);
  return word & ((uint64_t(1) << n) - 1);
}

// The specification: Y^T[n][m] = sum over nonzeros k (ascending) of fma(W[n][k], X^T[k][m], .).
void rows_scalar(const Problem& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    float* y = p.yt + n * p.Mp;
    std::fill(y, y + p.Mp, 0.0f);
    const float* v = p.values + p.offsets[n];
    for (int64_t k0 = 0; k0 < p.K; k0 += kChunk) {
      uint64_t word = bit_chunk(p.bits, p.nbytes, n * p.K + k0, std::min(kChunk, p.K - k0));
      while (word) {
        const int64_t k = k0 + __builtin_ctzll(word);
        word &= word - 1;
        const float w = *v++;
        const float* x = p.xt + k * p.Mp;
        for (int64_t m = 0; m < p.Mp; ++m) y[m] = std::fma(w, x[m], y[m]);
      }
    }
  }
}

// 2:4 (values (N, K/2), meta (N, mc) nibbles: sparse_24.h). X^T and Y^T are held as panels of
// 16 columns, X^T (Mp/16, K, 16) and Y^T (Mp/16, N, 16): a panel's rows are contiguous, so the
// strip a register tile reads is K x 64 bytes in a row (in (K, Mp) the rows sit Mp floats apart
// and, at a power-of-two Mp, all map to the same few cache sets).
struct Problem24 {
  const float* values;
  const uint8_t* meta;
  int64_t N, K, mc, panels;
  const float* xt;
  float* yt;
};

// The specification: Y^T[n][m] = fma(w1, X^T[k1][m], fma(w0, X^T[k0][m], .)) over the groups in
// order, (k0, k1) the group's kept columns.
void rows24_scalar(const Problem24& p, int64_t n0, int64_t n1) {
  for (int64_t t = 0; t < p.panels; ++t)
    for (int64_t n = n0; n < n1; ++n) {
      float* y = p.yt + (t * p.N + n) * kPad;
      std::fill(y, y + kPad, 0.0f);
      const float* v = p.values + n * (p.K / 2);
      for (int64_t g = 0; g < p.K / 4; ++g) {
        const int nib = (p.meta[n * p.mc + g / 2] >> (4 * (g & 1))) & 15;
        const float* x0 = p.xt + (t * p.K + 4 * g + (nib & 3)) * kPad;
        const float* x1 = p.xt + (t * p.K + 4 * g + (nib >> 2)) * kPad;
        for (int64_t j = 0; j < kPad; ++j) y[j] = std::fma(v[2 * g + 1], x1[j], std::fma(v[2 * g], x0[j], y[j]));
      }
    }
}

#ifdef MG_SPARSE_X86

// The scan over row n's nonzeros, with `body` run for each (k, w); shared by the SIMD paths
// (a macro, not a lambda: a lambda would not inherit its function's target instruction set).
#define MG_FOR_EACH_NONZERO(p, n, body)                                                          \
  do {                                                                                           \
    const float* v_ = (p).values + (p).offsets[n];                                               \
    for (int64_t k0_ = 0; k0_ < (p).K; k0_ += kChunk) {                                          \
      uint64_t word_ = bit_chunk((p).bits, (p).nbytes, (n) * (p).K + k0_, std::min(kChunk, (p).K - k0_)); \
      while (word_) {                                                                            \
        const int64_t k = k0_ + __builtin_ctzll(word_);                                          \
        word_ &= word_ - 1;                                                                      \
        const float w = *v_++;                                                                   \
        body;                                                                                    \
      }                                                                                          \
    }                                                                                            \
  } while (0)

__attribute__((target("avx2,fma"))) void rows_avx2(const Problem& p, int64_t n0, int64_t n1) {
  int64_t m0 = 0;
  for (; m0 + kTile <= p.Mp; m0 += kTile)  // 8 ymm accumulators: 64 columns
    for (int64_t n = n0; n < n1; ++n) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      MG_FOR_EACH_NONZERO(p, n, {
        const __m256 wv = _mm256_set1_ps(w);
        const float* x = p.xt + k * p.Mp + m0;
        a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), a0);
        a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 8), a1);
        a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 16), a2);
        a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 24), a3);
        a4 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 32), a4);
        a5 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 40), a5);
        a6 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 48), a6);
        a7 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 56), a7);
      });
      float* y = p.yt + n * p.Mp + m0;
      _mm256_storeu_ps(y, a0), _mm256_storeu_ps(y + 8, a1), _mm256_storeu_ps(y + 16, a2);
      _mm256_storeu_ps(y + 24, a3), _mm256_storeu_ps(y + 32, a4), _mm256_storeu_ps(y + 40, a5);
      _mm256_storeu_ps(y + 48, a6), _mm256_storeu_ps(y + 56, a7);
    }
  for (; m0 < p.Mp; m0 += kPad)  // the rest: 16 columns at a time
    for (int64_t n = n0; n < n1; ++n) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0;
      MG_FOR_EACH_NONZERO(p, n, {
        const __m256 wv = _mm256_set1_ps(w);
        const float* x = p.xt + k * p.Mp + m0;
        a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), a0);
        a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 8), a1);
      });
      float* y = p.yt + n * p.Mp + m0;
      _mm256_storeu_ps(y, a0), _mm256_storeu_ps(y + 8, a1);
    }
}

__attribute__((target("avx512f"))) void rows_avx512(const Problem& p, int64_t n0, int64_t n1) {
  int64_t m0 = 0;
  for (; m0 + kTile <= p.Mp; m0 += kTile)  // 4 zmm accumulators: 64 columns
    for (int64_t n = n0; n < n1; ++n) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      MG_FOR_EACH_NONZERO(p, n, {
        const __m512 wv = _mm512_set1_ps(w);
        const float* x = p.xt + k * p.Mp + m0;
        a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x), a0);
        a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 16), a1);
        a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 32), a2);
        a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 48), a3);
      });
      float* y = p.yt + n * p.Mp + m0;
      _mm512_storeu_ps(y, a0), _mm512_storeu_ps(y + 16, a1), _mm512_storeu_ps(y + 32, a2);
      _mm512_storeu_ps(y + 48, a3);
    }
  for (; m0 < p.Mp; m0 += kPad)
    for (int64_t n = n0; n < n1; ++n) {
      __m512 a0 = _mm512_setzero_ps();
      MG_FOR_EACH_NONZERO(p, n, {
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(p.xt + k * p.Mp + m0), a0);
      });
      _mm512_storeu_ps(p.yt + n * p.Mp + m0, a0);
    }
}

// 2:4, R rows of W at once over one panel (16 columns: one zmm, or two ymm, per row): R
// independent accumulator chains hide the FMA latency; the panel is reused by every row.
template <int R>
__attribute__((target("avx512f"))) void block24_avx512(const Problem24& p, const float* xp, float* yp, int64_t n) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < p.K / 4; ++g) {
    const float* x = xp + 4 * g * kPad;
    for (int r = 0; r < R; ++r) {
      const int nib = (p.meta[(n + r) * p.mc + g / 2] >> (4 * (g & 1))) & 15;
      const float* v = p.values + (n + r) * (p.K / 2) + 2 * g;
      a[r] = _mm512_fmadd_ps(_mm512_set1_ps(v[0]), _mm512_loadu_ps(x + (nib & 3) * kPad), a[r]);
      a[r] = _mm512_fmadd_ps(_mm512_set1_ps(v[1]), _mm512_loadu_ps(x + (nib >> 2) * kPad), a[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(yp + (n + r) * kPad, a[r]);
}

__attribute__((target("avx512f"))) void rows24_avx512(const Problem24& p, int64_t n0, int64_t n1) {
  for (int64_t t = 0; t < p.panels; ++t) {
    const float* xp = p.xt + t * p.K * kPad;
    float* yp = p.yt + t * p.N * kPad;
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) block24_avx512<8>(p, xp, yp, n);
    for (; n < n1; ++n) block24_avx512<1>(p, xp, yp, n);
  }
}

template <int R>
__attribute__((target("avx2,fma"))) void block24_avx2(const Problem24& p, const float* xp, float* yp, int64_t n) {
  __m256 a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < p.K / 4; ++g) {
    const float* x = xp + 4 * g * kPad;
    for (int r = 0; r < R; ++r) {
      const int nib = (p.meta[(n + r) * p.mc + g / 2] >> (4 * (g & 1))) & 15;
      const float* v = p.values + (n + r) * (p.K / 2) + 2 * g;
      const float *x0 = x + (nib & 3) * kPad, *x1 = x + (nib >> 2) * kPad;
      const __m256 w0 = _mm256_set1_ps(v[0]), w1 = _mm256_set1_ps(v[1]);
      a[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1), _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0), a[r]));
      b[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + 8), _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + 8), b[r]));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(yp + (n + r) * kPad, a[r]);
    _mm256_storeu_ps(yp + (n + r) * kPad + 8, b[r]);
  }
}

__attribute__((target("avx2,fma"))) void rows24_avx2(const Problem24& p, int64_t n0, int64_t n1) {
  for (int64_t t = 0; t < p.panels; ++t) {
    const float* xp = p.xt + t * p.K * kPad;
    float* yp = p.yt + t * p.N * kPad;
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) block24_avx2<4>(p, xp, yp, n);
    for (; n < n1; ++n) block24_avx2<1>(p, xp, yp, n);
  }
}

#undef MG_FOR_EACH_NONZERO
#endif  // MG_SPARSE_X86

// X^T (K, Mp) from x (M, K) in 16 x 16 blocks (a row at a time would touch a new page for every
// element); the padding columns zero.
void transpose_in(const Tensor& xc, int64_t M, int64_t K, int64_t Mp, Tensor& xt) {
  const float* xs = xc.data<float>();
  float* xtp = xt.data<float>();
  for (int64_t k0 = 0; k0 < K; k0 += 16)
    for (int64_t m0 = 0; m0 < M; m0 += 16)
      for (int64_t k = k0; k < std::min(K, k0 + 16); ++k)
        for (int64_t m = m0; m < std::min(M, m0 + 16); ++m) xtp[k * Mp + m] = xs[m * K + k];
  for (int64_t k = 0; k < K; ++k) std::fill(xtp + k * Mp + M, xtp + (k + 1) * Mp, 0.0f);
}

// out (M, N) = (Y^T)^T + bias, in 16 x 16 blocks so both sides stay in cache.
void transpose_out(const Tensor& yt, int64_t M, int64_t N, int64_t Mp, const Tensor& bias, Tensor& out) {
  float* o = out.data<float>();
  const float* y = yt.data<float>();
  const Tensor bc = bias.defined() ? contiguous(bias) : Tensor();
  const float* b = bc.defined() ? bc.data<float>() : nullptr;
  for (int64_t m0 = 0; m0 < M; m0 += 16)
    for (int64_t n0 = 0; n0 < N; n0 += 16)
      for (int64_t m = m0; m < std::min(M, m0 + 16); ++m)
        for (int64_t n = n0; n < std::min(N, n0 + 16); ++n) o[m * N + n] = y[n * Mp + m] + (b ? b[n] : 0.0f);
}

// x (M, K) as panels of 16 rows, (Mp/16, K, 16) (X^T a panel at a time); rows past M zero.
void pack_panels(const Tensor& xc, int64_t M, int64_t K, int64_t Mp, Tensor& xt) {
  const float* xs = xc.data<float>();
  float* xp = xt.data<float>();
  for (int64_t t = 0; t < Mp / kPad; ++t)
    for (int64_t j = 0; j < kPad; ++j) {
      const int64_t m = t * kPad + j;
      float* dst = xp + t * K * kPad + j;
      if (m < M)
        for (int64_t k = 0; k < K; ++k) dst[k * kPad] = xs[m * K + k];
      else
        for (int64_t k = 0; k < K; ++k) dst[k * kPad] = 0.0f;
    }
}

// out (M, N) = Y^T panels (Mp/16, N, 16) transposed back, + bias.
void unpack_panels(const Tensor& yt, int64_t M, int64_t N, const Tensor& bias, Tensor& out) {
  float* o = out.data<float>();
  const float* y = yt.data<float>();
  const Tensor bc = bias.defined() ? contiguous(bias) : Tensor();
  const float* b = bc.defined() ? bc.data<float>() : nullptr;
  for (int64_t m = 0; m < M; ++m) {
    const float* src = y + (m / kPad) * N * kPad + m % kPad;
    for (int64_t n = 0; n < N; ++n) o[m * N + n] = src[n * kPad] + (b ? b[n] : 0.0f);
  }
}

// The checks both ops share: an f32 cpu input without a graph, a bias of N, a path this CPU has.
int64_t check_sparse_input(const char* op, const Tensor& x, int64_t N, const Tensor& bias, SparseGemmPath path) {
  check_defined(op, x, "input");
  MG_CHECK(x.device().is_cpu() && x.dtype() == DType::f32, op, ": expected an f32 cpu input, got ", x.dtype(),
           " on ", x.device().str(), "\n  hint: sparse inference runs in f32 on the host");
  MG_CHECK(!(grad_enabled() && x.requires_grad()), op, ": inference only (no backward); the input requires a "
           "gradient\n  hint: run under NoGradGuard, or train the dense model with its masks");
  MG_CHECK(x.dim() >= 1, op, ": the input needs at least 1 dimension");
  if (bias.defined())
    MG_CHECK(bias.dtype() == DType::f32 && bias.device().is_cpu() && bias.dim() == 1 && bias.size(0) == N, op,
             ": bias must be (", N, ") f32 on cpu, got ", shape_str(bias.shape()));
  MG_CHECK(sparse_gemm_path_supported(path), op, ": this CPU lacks the ", sparse_gemm_path_name(path), " path");
  return x.size(-1);
}

}  // namespace

const char* sparse_gemm_path_name(SparseGemmPath p) {
  switch (p) {
    case SparseGemmPath::scalar: return "scalar";
    case SparseGemmPath::avx2: return "AVX2+FMA";
    case SparseGemmPath::avx512: return "AVX-512F";
  }
  return "?";
}

bool sparse_gemm_path_supported(SparseGemmPath p) {
#ifdef MG_SPARSE_X86
  if (p == SparseGemmPath::avx512) return __builtin_cpu_supports("avx512f");
  if (p == SparseGemmPath::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  if (p != SparseGemmPath::scalar) return false;
#endif
  return true;
}

SparseGemmPath sparse_gemm_best_path() {
  for (SparseGemmPath p : {SparseGemmPath::avx512, SparseGemmPath::avx2})
    if (sparse_gemm_path_supported(p)) return p;
  return SparseGemmPath::scalar;
}

Tensor bitmask_row_offsets(const Tensor& bits, int64_t rows, int64_t cols) {
  MG_CHECK(bits.defined() && bits.device().is_cpu() && bits.is_contiguous() && bits.dtype() == DType::u8,
           "bitmask_row_offsets: expected contiguous cpu u8 bits");
  MG_CHECK(rows >= 0 && cols >= 0 && bits.numel() >= (rows * cols + 7) / 8, "bitmask_row_offsets: ", bits.numel(),
           " bytes of bits cannot hold a (", rows, ", ", cols, ") matrix");
  Tensor off = empty({rows + 1}, {.dtype = DType::i64, .device = bits.device()});
  int64_t* o = off.data<int64_t>();
  const uint8_t* b = bits.data<uint8_t>();
  o[0] = 0;
  for (int64_t n = 0; n < rows; ++n) {
    int64_t c = 0;
    for (int64_t k0 = 0; k0 < cols; k0 += kChunk)
      c += __builtin_popcountll(bit_chunk(b, bits.numel(), n * cols + k0, std::min(kChunk, cols - k0)));
    o[n + 1] = o[n] + c;
  }
  return off;
}

Tensor bitmask_linear(const Tensor& x, const Tensor& bits, const Tensor& values, const Tensor& row_offsets,
                      int64_t N, const Tensor& bias, std::optional<SparseGemmPath> path_opt) {
  const char* op = "bitmask_linear";
  const SparseGemmPath path = path_opt.value_or(sparse_gemm_best_path());
  const int64_t K = check_sparse_input(op, x, N, bias, path);
  for (const Tensor* t : {&bits, &values, &row_offsets, &bias})
    if (t->defined()) check_same_device(op, x, *t);
  MG_CHECK(bits.defined() && bits.device().is_cpu() && bits.is_contiguous() && bits.dtype() == DType::u8 &&
               bits.numel() >= (N * K + 7) / 8,
           op, ": the bitmask must be contiguous cpu u8 of >= ", (N * K + 7) / 8, " bytes for a (", N, ", ", K,
           ") weight, got ", bits.defined() ? bits.numel() : 0);
  MG_CHECK(row_offsets.defined() && row_offsets.dtype() == DType::i64 && row_offsets.is_contiguous() &&
               row_offsets.device().is_cpu() && row_offsets.numel() == N + 1,
           op, ": row_offsets must be (", N + 1, ") i64 from bitmask_row_offsets");
  const int64_t nnz = row_offsets.data<int64_t>()[N];
  MG_CHECK(values.defined() && values.dtype() == DType::f32 && values.is_contiguous() && values.device().is_cpu() &&
               values.numel() == nnz,
           op, ": the row offsets count ", nnz, " nonzeros, the values tensor holds ",
           values.defined() ? values.numel() : 0, " (f32 expected)");
  OpNameGuard name(op);
  Shape shape = x.shape();
  shape.back() = N;
  Tensor out = empty(shape, {.dtype = DType::f32, .device = x.device()});  // (..., N)
  const int64_t M = K > 0 ? x.numel() / K : 0, Mp = (M + kPad - 1) / kPad * kPad;
  if (out.numel() == 0) return out;
  Tensor xc = contiguous(x.detach());
  Tensor xt, yt;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    xt = empty({std::max<int64_t>(K, 1), Mp}, {.device = x.device()});  // (K, Mp): X^T
    yt = empty({N, Mp}, {.device = x.device()});                        // (N, Mp): Y^T
  }
  transpose_in(xc, M, K, Mp, xt);
  const Problem p{bits.data<uint8_t>(), bits.numel(), values.data<float>(), row_offsets.data<int64_t>(), N, K, Mp,
                  xt.data<float>(), yt.data<float>()};
  // Grain: enough rows that a chunk does ~64k multiply-adds.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, (nnz / std::max<int64_t>(N, 1) + 1) * Mp));
  parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    switch (path) {
#ifdef MG_SPARSE_X86
      case SparseGemmPath::avx512: rows_avx512(p, n0, n1); break;
      case SparseGemmPath::avx2: rows_avx2(p, n0, n1); break;
#endif
      default: rows_scalar(p, n0, n1);
    }
  });
  transpose_out(yt, M, N, Mp, bias, out);
  return out;
}

Tensor sparse24_linear(const Tensor& x, const Tensor& values, const Tensor& meta, int64_t N, const Tensor& bias,
                       std::optional<SparseGemmPath> path_opt) {
  const char* op = "sparse24_linear";
  const SparseGemmPath path = path_opt.value_or(sparse_gemm_best_path());
  const int64_t K = check_sparse_input(op, x, N, bias, path);
  MG_CHECK(K % 4 == 0, op, ": a 2:4 weight needs an input width that is a multiple of 4, got ", K);
  const int64_t mc = (K / 4 + 1) / 2;
  MG_CHECK(values.defined() && values.dtype() == DType::f32 && values.is_contiguous() && values.device().is_cpu() &&
               values.numel() == N * K / 2,
           op, ": the values of a (", N, ", ", K, ") 2:4 weight are (", N, ", ", K / 2, ") contiguous f32 on cpu, got ",
           values.defined() ? shape_str(values.shape()) : std::string("none"));
  MG_CHECK(meta.defined() && meta.dtype() == DType::u8 && meta.is_contiguous() && meta.device().is_cpu() &&
               meta.numel() == N * mc,
           op, ": the metadata of a (", N, ", ", K, ") 2:4 weight is (", N, ", ", mc, ") contiguous u8 on cpu, got ",
           meta.defined() ? shape_str(meta.shape()) : std::string("none"));
  OpNameGuard name(op);
  Shape shape = x.shape();
  shape.back() = N;
  Tensor out = empty(shape, {.dtype = DType::f32, .device = x.device()});  // (..., N)
  const int64_t M = K > 0 ? x.numel() / K : 0, Mp = (M + kPad - 1) / kPad * kPad;
  if (out.numel() == 0) return out;
  Tensor xc = contiguous(x.detach());
  Tensor xt, yt;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    xt = empty({Mp / kPad, std::max<int64_t>(K, 1), kPad}, {.device = x.device()});  // X^T panels
    yt = empty({Mp / kPad, N, kPad}, {.device = x.device()});                        // Y^T panels
  }
  pack_panels(xc, M, K, Mp, xt);
  const Problem24 p{values.data<float>(), meta.data<uint8_t>(), N, K, mc, Mp / kPad, xt.data<float>(), yt.data<float>()};
  const int64_t grain = std::max<int64_t>(8, 65536 / std::max<int64_t>(1, (K / 2 + 1) * Mp));  // ~64k multiply-adds
  parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    switch (path) {
#ifdef MG_SPARSE_X86
      case SparseGemmPath::avx512: rows24_avx512(p, n0, n1); break;
      case SparseGemmPath::avx2: rows24_avx2(p, n0, n1); break;
#endif
      default: rows24_scalar(p, n0, n1);
    }
  });
  unpack_panels(yt, M, N, bias, out);
  return out;
}

}  // namespace mg
