// memgrad's own single-threaded f32 GEMM (the products inside cpu_gemm's tiles): op(A) and op(B)
// packed into register-tile slivers, multiplied by an AVX-512, AVX2 or scalar micro-kernel chosen
// at run time. It sums every element in exactly the order Eigen 3.4's GEMM does (same k blocks,
// same per-block accumulators, the same fused multiply-adds), so it gives Eigen's bits to the
// last one and every loss in memgrad stays what it was (Note [Eigen's summation order]).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ops/cpu_gemm.h"

namespace mg::gemm_packed {

// How a micro-tile's first k block meets the C that was there (later blocks always add onto C).
enum class Init : uint8_t {
  load,   // C += alpha * acc (beta == 1, or not the first k block)
  zero,   // C = alpha * acc + 0 (beta == 0: C is never read; as Eigen's setZero then add)
  scale,  // C = alpha * acc + beta * C (beta * C rounded first, as Eigen's `c *= beta`)
  bias,   // C = alpha * acc + bias[j] (what `load` gives when C was filled with the bias first)
};

// How a micro-tile's accumulators sum over k (Note [Eigen's summation order]).
enum class Order : uint8_t {
  sequential,  // acc = fma(a_k, b_k, acc) for k = 0, 1, ...
  even_odd,    // the k < (kc & ~7) alternate between two accumulators, added, then the rest in turn
};

// One micro-tile: C (mr x nr, row stride ldc) from kc steps of packed operands. a holds, per k,
// `a_step` floats of which the first `mr` are the tile's rows of op(A); b holds, per k, the
// kernel's NR floats of op(B)'s columns (zero-padded past nr).
struct MicroTile {
  int64_t kc;
  const float* a;
  int64_t a_step;
  const float* b;
  float* c;
  int64_t ldc;
  int mr, nr;
  float alpha, beta;
  Init init;
  const float* bias;  // Init::bias: the tile's nr bias values
};
using MicroKernel = void (*)(const MicroTile&);

// Packs n rows or columns into ceil(n / w) slivers of kc x w floats each, one after another, w the
// kernel's mr (op(A)) or nr (op(B)): sliver s holds dst[s kc w + k w + r] = the element of line
// s w + r at k, which is src[line * ld + k] (transposing) or src[k * ld + line] (copying), and 0
// for lines past n.
using Packer = void (*)(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc);

constexpr int kMaxMr = 14;  // the tallest register tile of any family

// A micro-kernel family. Its packers fill slivers of mr rows of op(A) and nr columns of op(B),
// from rows of the stored matrix (transposing) or from its columns (copying). kernel[o][w][rows]
// runs a micro-tile of 1 .. max_rows[o][w] rows in order o (0 sequential, 1 even_odd), two
// vectors wide (w = 0) or one (w = 1, for slivers of at most narrow_nr real columns; 0: none):
// the smallest register tile that holds the rows, so a sliver's 4-row tail does not pay for 12.
struct MicroKernels {
  GemmKernel kind;
  int mr, nr, narrow_nr;
  int max_rows[2][2];
  MicroKernel kernel[2][2][kMaxMr + 1];
  Packer pack_a_transposing, pack_a_copying, pack_b_transposing, pack_b_copying;
};

// Fills kernel[o][w][1 .. max] of m from register tiles of Rows... rows (ascending), each made
// by `make` (a template over the row count, e.g. a lambda returning &kernel<R, NV, O>).
template <int... Rows, class Make>
void set_kernels(MicroKernels& m, int o, int w, Make make) {
  constexpr int rows[] = {Rows...};
  const MicroKernel ks[] = {make(std::integral_constant<int, Rows>{})...};
  size_t j = 0;
  for (int r = 1; r <= rows[sizeof...(Rows) - 1]; ++r) {
    while (rows[j] < r) ++j;
    m.kernel[o][w][r] = ks[j];
  }
  m.max_rows[o][w] = rows[sizeof...(Rows) - 1];
}

const MicroKernels& scalar_kernels();
#if defined(__x86_64__) || defined(_M_X64)
const MicroKernels& avx2_kernels();    // ops/cpu_gemm_avx2.cpp (AVX2 + FMA)
const MicroKernels& avx512_kernels();  // ops/cpu_gemm_avx512.cpp (AVX-512 F)
#endif

// Whether this CPU runs `k` (scalar and eigen: always).
bool kernel_supported(GemmKernel k);

// C (M, N) = alpha op(A) op(B) + beta C, single-threaded, in Eigen's order, with kernels `mk`.
// With `bias` (N floats; beta must be 1) C's old value is bias[j] on every row instead, the
// bits of filling C with the bias and adding onto it, without that pass over C.
// Needs M, N >= 2 and M + N + K >= 20 (smaller products take Eigen's other code paths: call
// Eigen for them).
void sgemm(const MicroKernels& mk, Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const float* bias = nullptr);

// Whether sgemm takes a product of these sizes (else Eigen's GEMV or coefficient-wise product).
bool handles(int64_t M, int64_t N, int64_t K);

// Eigen's k, column (mc) and row (nc) blocks of an (M, N, K) product: what the sums depend on.
struct Blocking {
  int64_t kc, mc, nc;
};
Blocking blocking(int64_t M, int64_t N, int64_t K);

// One tile of cpu_gemm's grid: C's rows [r0, r0 + rows) and columns [c0, c0 + cols), an Eigen
// product of that size (blocking bl = blocking(rows, cols, K)) of its own.
struct Tile {
  int64_t r0, rows, c0, cols;
  Blocking bl;
};

// Several tiles of one product on one thread, each with the bits of its own sgemm, but op(A)'s rows
// packed once per k block for all of them and each chunk of op(B) once for the tiles of its column
// range (the tiles of a grid otherwise repack what their row and column neighbours packed).
// A, B, C, bias: the whole product's (tiles index into them). Every tile must be handled() and
// all must share bl.kc.
void sgemm_tiles(const MicroKernels& mk, Transpose ta, Transpose tb, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias,
                 const Tile* tiles, size_t n);

// bf16 tiles on AVX512-BF16's vdpbf16ps (ops/cpu_gemm_bf16.cpp): C (rows, cols) = alpha op(A)
// op(B) + beta C, summed in f32 and rounded to bf16 on store, in `ws` (at least
// bf16_pairs_workspace_floats(rows, cols, K) floats: the packed pairs and the f32 tile).
bool bf16_pairs_supported();
int64_t bf16_pairs_workspace_floats(int64_t rows, int64_t cols, int64_t K);
void bf16_pairs_gemm(Transpose ta, Transpose tb, int64_t rows, int64_t cols, int64_t K, float alpha,
                     const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta, BFloat16* C,
                     int64_t ldc, float* ws);

// The same bf16 tiles on AMX (ops/cpu_gemm_amx.cpp), in `ws` of at least
// amx_bf16_workspace_floats(rows, cols, K) floats. Supported where the CPU has AMX-BF16 and the
// OS grants the tile registers (asked once); set_amx_bf16_allowed(false) turns it off (tests,
// MG_AMX=0) so that the vdpbf16ps path runs instead.
bool amx_bf16_supported();
void set_amx_bf16_allowed(bool on);
int64_t amx_bf16_workspace_floats(int64_t rows, int64_t cols, int64_t K);
void amx_bf16_gemm(Transpose ta, Transpose tb, int64_t rows, int64_t cols, int64_t K, float alpha,
                   const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta, BFloat16* C,
                   int64_t ldc, float* ws);

}  // namespace mg::gemm_packed
