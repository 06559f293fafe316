// cpu_gemm with memgrad's own threading so that results do not depend on the thread count: C is
// cut into a grid of tiles fixed by (M, N, K) alone, and each tile is one single-threaded product,
// the tiles run in parallel with parallel_for. (A library's own threaded GEMM splits C by thread
// count, and edge tiles round differently from full ones, so the same product would give different
// bits on 1 and 2 threads.) An f32 tile is memgrad's packed GEMM (ops/cpu_gemm_packed.h, ~20% faster
// than Eigen's on AVX-512, bench/bench_matmul.cpp) summing in Eigen's order; f64 tiles are Eigen's.
// Not OpenBLAS: bench/bench_matmul.cpp measured Eigen >10% faster than this OpenBLAS, whose runtime
// CPU detection falls back to its Haswell (AVX2) kernels on AVX-512 machines.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
// GCC 12 false positive on _mm512_undefined_ps() inside Eigen's AVX-512 kernels (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "ops/cpu_gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "core/half_convert.h"
#include "core/memory_category.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/cpu_gemm_packed.h"

namespace mg {
namespace {

// Products up to this many multiply-adds are one tile; larger ones are cut into 2 to 16.
constexpr int64_t kSerialMacs = int64_t(1) << 18;
constexpr int64_t kMaxTiles = 16;      // a power of two: tiles divide evenly over 2, 4, 8, 16 threads
constexpr int64_t kTileAlign = 16;     // tile sides are multiples of the kernels' unroll
constexpr int64_t kMinTileSide = 64;   // no tile thinner than this after the first split
constexpr int64_t kMinTileMacs = int64_t(1) << 25;  // ~3% overhead per tile below this (measured)
// 16-bit products: tiles run on at most this many lanes of f32 panels (Note [GEMM lanes]), so
// their workspace is at most 8 tiles' panels whatever the thread count.
constexpr int64_t kGemmLanes = 8;

// A grid of tm x tn tiles of (rows, cols) each (the last row / column of tiles may be smaller).
struct TileGrid {
  int64_t tm = 1, tn = 1, rows = 0, cols = 0;
};

// The side of each of t tiles over n: rounded up to the kernel unroll once it is that long.
int64_t tile_side(int64_t n, int64_t t) {
  const int64_t base = (n + t - 1) / t;
  return base >= kTileAlign ? std::min(n, (base + kTileAlign - 1) / kTileAlign * kTileAlign) : base;
}

// Halves the longer tile side while tiles stay thick and big enough; always 2+ tiles when it can.
TileGrid plan_tiles(int64_t M, int64_t N, int64_t K) {
  int64_t tm = 1, tn = 1;
  while (tm * tn < kMaxTiles) {
    const int64_t r = tile_side(M, tm), c = tile_side(N, tn);
    const bool split_rows = r >= c;
    const int64_t side = split_rows ? r : c, other = split_rows ? c : r, half = (side + 1) / 2;
    if (side < 2) break;
    const bool first = tm * tn == 1;
    if (!first && (half < kMinTileSide || half * other * K < kMinTileMacs)) break;
    (split_rows ? tm : tn) *= 2;
  }
  TileGrid g;
  g.rows = tile_side(M, tm);
  g.cols = tile_side(N, tn);
  g.tm = (M + g.rows - 1) / g.rows;  // rounding may leave fewer, fuller tiles
  g.tn = (N + g.cols - 1) / g.cols;
  return g;
}

void check_sizes(int64_t M, int64_t N, int64_t K) {
  MG_CHECK(M >= 0 && N >= 0 && K >= 0, "cpu_gemm: negative size M=", M, " N=", N, " K=", K);
}

// A row-major matrix needs ld >= max(1, row length); a smaller one is a caller bug.
void check_ld(int64_t ld, int64_t row_len, const char* which) {
  MG_CHECK(ld >= std::max<int64_t>(row_len, 1), "cpu_gemm: leading dimension ", which, " = ", ld,
           " is smaller than the row length ", row_len);
}

// Runs one product single-threaded: Eigen threads a GEMM unless it is inside a parallel region
// of 2+ threads or omp_get_max_threads() is 1, so the latter is set for the calling thread.
class SerialEigen {
 public:
#ifdef _OPENMP
  SerialEigen() : prev_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SerialEigen() { omp_set_num_threads(prev_); }

 private:
  int prev_;
#endif
};

// C (M, N) = alpha * op(A) op(B) + beta * C on row-major maps with leading dimensions.
template <class T>
void eigen_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  const bool at = ta == Transpose::yes, bt = tb == Transpose::yes;
  Eigen::Map<const Mat, Eigen::Unaligned, Stride> a(A, at ? K : M, at ? M : K, Stride(lda));
  Eigen::Map<const Mat, Eigen::Unaligned, Stride> b(B, bt ? N : K, bt ? K : N, Stride(ldb));
  Eigen::Map<Mat, Eigen::Unaligned, Stride> c(C, M, N, Stride(ldc));
  auto run = [&](const auto& opa, const auto& opb) {
    if (beta == T(0)) {
      c.noalias() = (alpha * opa) * opb;  // C is not read: it may hold garbage
    } else {
      if (beta != T(1)) c *= beta;
      c.noalias() += (alpha * opa) * opb;
    }
  };
  SerialEigen serial;
  if (!at && !bt) run(a, b);
  else if (!at) run(a, b.transpose());
  else if (!bt) run(a.transpose(), b);
  else run(a.transpose(), b.transpose());
}

// The f32 kernel in use (cpu_gemm_kernel()): MG_GEMM_KERNEL, else the fastest this CPU runs.
GemmKernel parse_kernel(const char* name) {
  for (GemmKernel k : {GemmKernel::eigen, GemmKernel::scalar, GemmKernel::avx2, GemmKernel::avx512})
    if (std::strcmp(name, gemm_kernel_name(k)) == 0) return k;
  MG_CHECK(false, "MG_GEMM_KERNEL='", name, "' is not a GEMM kernel (known: avx512, avx2, scalar, eigen)");
  return GemmKernel::eigen;
}
GemmKernel default_kernel() {
  if (const char* env = std::getenv("MG_GEMM_KERNEL"); env != nullptr && *env != '\0') {
    const GemmKernel k = parse_kernel(env);
    MG_CHECK(gemm_packed::kernel_supported(k), "MG_GEMM_KERNEL=", env, ": this CPU does not run that kernel");
    return k;
  }
  for (GemmKernel k : {GemmKernel::avx512, GemmKernel::avx2})
    if (gemm_packed::kernel_supported(k)) return k;
  return GemmKernel::scalar;
}
std::atomic<GemmKernel>& kernel_state() {
  static std::atomic<GemmKernel> k{default_kernel()};
  return k;
}

// Note [bf16 dot by vendor]: vdpbf16ps does 32 multiply-adds per instruction where an f32 FMA
// does 16, but how many the core issues per cycle differs: on AMD Zen 4 its FLOP rate is twice
// the f32 FMAs' (gpt-small's bf16 step 0.75x fp32's), on Intel Sapphire Rapids half of it (86 vs
// 174 GFLOP/s per core, `bench_matmul --benchmark_filter=InstructionPeak`; gpt-small's bf16 step 1.4-1.8x
// fp32's on it, 1.08-1.17x through the converting path). `bench_matmul --benchmark_filter=GemmBf16`
// measures both paths. The default is a CPU's vendor, not a timing, so the same machine always
// sums the same way: vdpbf16ps on AMD, the converting path elsewhere; MG_BF16_DOT=0|1 overrides.
bool default_bf16_dot() {
  if (!gemm_packed::bf16_pairs_supported()) return false;
  if (const char* env = std::getenv("MG_BF16_DOT"); env != nullptr && *env != '\0') {
    MG_CHECK(std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0, "MG_BF16_DOT='", env, "' must be 0 or 1");
    return env[0] == '1';
  }
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}
std::atomic<bool>& bf16_dot_state() {
  static std::atomic<bool> on{default_bf16_dot()};
  return on;
}

// bf16 products on vdpbf16ps (ops/cpu_gemm_bf16.cpp): with the AVX-512 kernels, where the dot is
// switched on (Note [bf16 dot by vendor]); the other kernels keep the converting path.
bool native_bf16() {
  return bf16_dot_state().load(std::memory_order_relaxed) &&
         kernel_state().load(std::memory_order_relaxed) == GemmKernel::avx512;
}

// bf16 products on AMX tiles (ops/cpu_gemm_amx.cpp): with the AVX-512 kernels on a CPU with
// AMX-BF16, unless MG_AMX=0.
bool native_amx() {
  static const bool wanted = [] {
    const char* env = std::getenv("MG_AMX");
    return !(env != nullptr && std::strcmp(env, "0") == 0);
  }();
  return wanted && kernel_state().load(std::memory_order_relaxed) == GemmKernel::avx512 &&
         gemm_packed::amx_bf16_supported();
}

const gemm_packed::MicroKernels& micro_kernels(GemmKernel k) {
#if defined(__x86_64__) || defined(_M_X64)
  if (k == GemmKernel::avx512) return gemm_packed::avx512_kernels();
  if (k == GemmKernel::avx2) return gemm_packed::avx2_kernels();
#endif
  return gemm_packed::scalar_kernels();
}

// One tile, single-threaded: f32 on the packed GEMM (unless Eigen is chosen, or the sizes are
// ones Eigen runs as a GEMV or coefficient-wise: Eigen then, for its bits), f64 on Eigen.
// Every row of C (M, N) set to bias (N).
template <class T>
void fill_bias(int64_t M, int64_t N, const T* bias, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) std::copy(bias, bias + N, C + i * ldc);
}

// With `bias` (beta is then 1): C's old value is the bias on every row (the packed GEMM reads it
// in its first k block; other paths fill C with it first, with the same bits).
template <class T>
void serial_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                 const T* B, int64_t ldb, T beta, T* C, int64_t ldc, const T* bias = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    const GemmKernel k = kernel_state().load(std::memory_order_relaxed);
    if (k != GemmKernel::eigen && gemm_packed::handles(M, N, K))
      return gemm_packed::sgemm(micro_kernels(k), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
  }
  if (bias != nullptr) fill_bias(M, N, bias, C, ldc);
  eigen_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The f32 grid on the packed GEMM: each thread takes a run of consecutive tiles and packs their
// shared operand rows and columns once (gemm_packed::sgemm_tiles); the tiles' bits are their own,
// whichever thread runs them. False when the Eigen kernel is chosen or a tile needs Eigen's other
// code paths or the tiles' k blocks differ (then every tile runs on its own).
bool packed_grid(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias,
                 const TileGrid& g) {
  const GemmKernel k = kernel_state().load(std::memory_order_relaxed);
  if (k == GemmKernel::eigen) return false;
  std::vector<gemm_packed::Tile> tiles;
  tiles.reserve(size_t(g.tm * g.tn));
  for (int64_t t = 0; t < g.tm * g.tn; ++t) {
    const int64_t r0 = (t / g.tn) * g.rows, c0 = (t % g.tn) * g.cols;
    const int64_t rows = std::min(g.rows, M - r0), cols = std::min(g.cols, N - c0);
    if (!gemm_packed::handles(rows, cols, K)) return false;
    tiles.push_back({r0, rows, c0, cols, gemm_packed::blocking(rows, cols, K)});
    if (tiles.back().bl.kc != tiles[0].bl.kc) return false;
  }
  // Runs of tiles by thread: which thread runs a tile changes no bits, so the thread count may
  // decide the runs (one per thread; one run inside another parallel region).
  const int64_t n = int64_t(tiles.size());
  const int64_t runs = in_parallel_region() ? 1 : std::clamp<int64_t>(num_threads(), 1, n);
  const gemm_packed::MicroKernels& mk = micro_kernels(k);
  parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      gemm_packed::sgemm_tiles(mk, ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, tiles.data() + r * n / runs,
                               size_t((r + 1) * n / runs - r * n / runs));
  });
  return true;
}

template <class T>
void gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, const T* bias = nullptr) {
  if (M == 0 || N == 0) return;
  check_sizes(M, N, K);
  check_ld(ldc, N, "ldc");
  if (K == 0) {  // an empty sum: C = beta * C (or the bias)
    if (bias != nullptr) return fill_bias(M, N, bias, C, ldc);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  check_ld(lda, ta == Transpose::yes ? M : K, "lda");
  check_ld(ldb, tb == Transpose::yes ? K : N, "ldb");
  if (M * N * K <= kSerialMacs) return serial_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
  const TileGrid g = plan_tiles(M, N, K);
  if constexpr (std::is_same_v<T, float>) {
    if (packed_grid(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, g)) return;
  }
  parallel_for(0, g.tm * g.tn, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = (t / g.tn) * g.rows, c0 = (t % g.tn) * g.cols;
      const int64_t rows = std::min(g.rows, M - r0), cols = std::min(g.cols, N - c0);
      // Rows r0.. of op(A): rows of A, or columns of the stored A^T; columns c0.. of op(B) likewise.
      const T* a = ta == Transpose::no ? A + r0 * lda : A + r0;
      const T* b = tb == Transpose::no ? B + c0 : B + c0 * ldb;
      serial_gemm(ta, tb, rows, cols, K, alpha, a, lda, b, ldb, beta, C + r0 * ldc + c0, ldc,
                  bias ? bias + c0 : nullptr);
    }
  });
}

// The 16-bit product: the f32 tile grid of gemm() with each tile's operands converted to f32
// panels first (Note: the panels are what Eigen would pack anyway; converting them costs
// O(rows K + K cols) next to the tile's O(rows cols K) multiply-adds). Same tiles as f32, so the
// result does not depend on the thread count either. Note [GEMM lanes]: the panels live in the
// caller's workspace, one tile's worth per lane; tiles are dealt to lanes by index (lane l runs
// tiles l, l + lanes, ...), so the memory depends on the shapes only, never on the threads.
TileGrid low_grid(int64_t M, int64_t N, int64_t K) {
  return M * N * K <= kSerialMacs ? TileGrid{1, 1, M, N} : plan_tiles(M, N, K);
}
int64_t low_lanes(const TileGrid& g) { return std::min(kGemmLanes, g.tm * g.tn); }
int64_t low_lane_floats(const TileGrid& g, int64_t K) { return g.rows * K + K * g.cols + g.rows * g.cols; }

// Whether a 16-bit tile may run on the CPU's native bf16 instructions (AMX, vdpbf16ps): those
// tiles read the 16-bit operands themselves, tile by tile.
template <class H>
bool native_16bit_tiles() {
  return std::is_same_v<H, BFloat16> && (native_amx() || native_bf16());
}

// Copies of (rows, cols) matrices (row strides lds, ldd) between 16-bit and f32, all of them in one
// parallel loop over their rows (one barrier, not one per matrix).
template <class S, class D>
struct RowCopy {
  const S* src;
  int64_t lds;
  D* dst;
  int64_t ldd, rows, cols;
};
template <class S, class D, size_t N>
void convert_rows(const std::array<RowCopy<S, D>, N>& copies) {
  int64_t total = 0;
  for (const auto& c : copies) total += c.rows;
  parallel_for(0, total, 16, [&](int64_t begin, int64_t end) {
    int64_t first = 0;  // the row index where copies[i] starts
    for (const auto& c : copies) {
      const int64_t r0 = std::max(begin, first) - first, r1 = std::min(end, first + c.rows) - first;
      if (r0 < r1) convert_block(c.src + r0 * c.lds, c.lds, c.dst + r0 * c.ldd, c.ldd, r1 - r0, c.cols);
      first += c.rows;
    }
  });
}

// The converting path when the whole product's f32 copies fit the workspace the tiles would use
// (M K + K N + M N floats <= `floats`, true for most shapes: the 8 lanes' panels hold about as
// much): op(A), op(B) and C converted once, then the f32 grid (gemm<float>), whose threads pack
// shared rows and columns once for their tiles. Each tile gets the bits of its own serial product
// on the same tile grid, as the per-tile conversion below gives them, but the operands are not
// converted and packed again for every tile (gpt-small's bf16 GEMMs on the AVX2 kernels: 9% of
// the step). False, doing nothing, when the copies do not fit.
template <class H>
bool whole_f32_product(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const H* A,
                       int64_t lda, const H* B, int64_t ldb, float beta, H* C, int64_t ldc, float* workspace,
                       int64_t floats) {
  if (M * K + K * N + M * N > floats) return false;
  float* a = workspace;
  float* b = a + M * K;
  float* c = b + K * N;
  // Stored A is (M, K), or (K, M) for A^T; stored B (K, N), or (N, K) for B^T: copied as stored.
  const int64_t a_rows = ta == Transpose::no ? M : K, a_cols = ta == Transpose::no ? K : M;
  const int64_t b_rows = tb == Transpose::no ? K : N, b_cols = tb == Transpose::no ? N : K;
  convert_rows(std::array<RowCopy<H, float>, 3>{{{A, lda, a, a_cols, a_rows, a_cols},
                                                 {B, ldb, b, b_cols, b_rows, b_cols},
                                                 {C, ldc, c, N, beta != 0.0f ? M : 0, N}}});
  gemm<float>(ta, tb, M, N, K, alpha, a, a_cols, b, b_cols, beta, c, N);
  convert_rows(std::array<RowCopy<float, H>, 1>{{{c, N, C, ldc, M, N}}});  // round on store
  return true;
}

template <class H>
void gemm_low(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const H* A, int64_t lda,
              const H* B, int64_t ldb, float beta, H* C, int64_t ldc, float* workspace) {
  if (M == 0 || N == 0) return;
  check_sizes(M, N, K);
  check_ld(ldc, N, "ldc");
  if (K == 0) {  // an empty sum: C = beta * C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = H(beta == 0.0f ? 0.0f : beta * float(C[i * ldc + j]));
    return;
  }
  check_ld(lda, ta == Transpose::yes ? M : K, "lda");
  check_ld(ldb, tb == Transpose::yes ? K : N, "ldb");
  MG_INTERNAL_ASSERT(workspace != nullptr, "cpu_gemm: the 16-bit product needs its workspace");
  const TileGrid g = low_grid(M, N, K);
  const int64_t lanes = low_lanes(g), per_lane = low_lane_floats(g, K);
  if (!native_16bit_tiles<H>() && whole_f32_product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                               workspace, lanes * per_lane))
    return;
  auto tile = [&](int64_t t, float* pa) {
    const int64_t r0 = (t / g.tn) * g.rows, c0 = (t % g.tn) * g.cols;
    const int64_t rows = std::min(g.rows, M - r0), cols = std::min(g.cols, N - c0);
    if constexpr (std::is_same_v<H, BFloat16>) {
      // AMX tiles, else bf16 pairs on vdpbf16ps, where the CPU has them and the AVX-512 kernels are chosen.
      if (native_amx() && gemm_packed::amx_bf16_workspace_floats(rows, cols, K) <= per_lane)
        return gemm_packed::amx_bf16_gemm(ta, tb, rows, cols, K, alpha, ta == Transpose::no ? A + r0 * lda : A + r0,
                                          lda, tb == Transpose::no ? B + c0 : B + c0 * ldb, ldb, beta,
                                          C + r0 * ldc + c0, ldc, pa);
      if (native_bf16() && gemm_packed::bf16_pairs_workspace_floats(rows, cols, K) <= per_lane)
        return gemm_packed::bf16_pairs_gemm(ta, tb, rows, cols, K, alpha, ta == Transpose::no ? A + r0 * lda : A + r0,
                                            lda, tb == Transpose::no ? B + c0 : B + c0 * ldb, ldb, beta,
                                            C + r0 * ldc + c0, ldc, pa);
    }
    float* pb = pa + rows * K;
    float* pc = pb + K * cols;
    // op(A)'s rows r0..: stored rows (rows, K) of A, or stored columns (K, rows) of A^T.
    int64_t lda32, ldb32;
    if (ta == Transpose::no) convert_block(A + r0 * lda, lda, pa, lda32 = K, rows, K);
    else convert_block(A + r0, lda, pa, lda32 = rows, K, rows);
    // op(B)'s columns c0..: stored columns (K, cols) of B, or stored rows (cols, K) of B^T.
    if (tb == Transpose::no) convert_block(B + c0, ldb, pb, ldb32 = cols, K, cols);
    else convert_block(B + c0 * ldb, ldb, pb, ldb32 = K, cols, K);
    if (beta != 0.0f) convert_block(C + r0 * ldc + c0, ldc, pc, cols, rows, cols);
    serial_gemm<float>(ta, tb, rows, cols, K, alpha, pa, lda32, pb, ldb32, beta, pc, cols);
    convert_block(static_cast<const float*>(pc), cols, C + r0 * ldc + c0, ldc, rows, cols);  // round on store
  };
  if (lanes == 1) {
    for (int64_t t = 0; t < g.tm * g.tn; ++t) tile(t, workspace);
    return;
  }
  parallel_for(0, lanes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t lane = begin; lane < end; ++lane)
      for (int64_t t = lane; t < g.tm * g.tn; t += lanes) tile(t, workspace + lane * per_lane);
  });
}

}  // namespace

int64_t cpu_gemm_workspace_floats(int64_t M, int64_t N, int64_t K) {
  check_sizes(M, N, K);
  if (M == 0 || N == 0 || K == 0) return 0;
  const TileGrid g = low_grid(M, N, K);
  return low_lanes(g) * low_lane_floats(g, K);
}

void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A,
              int64_t lda, const BFloat16* B, int64_t ldb, float beta, BFloat16* C, int64_t ldc, float* workspace) {
  gemm_low<BFloat16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, workspace);
}

void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const Half* A, int64_t lda,
              const Half* B, int64_t ldb, float beta, Half* C, int64_t ldc, float* workspace) {
  gemm_low<Half>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, workspace);
}

void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm<float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
              int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  gemm<double>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cpu_gemm_bias(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, const float* bias, float* C, int64_t ldc) {
  MG_INTERNAL_ASSERT(bias != nullptr, "cpu_gemm_bias: no bias");
  gemm<float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc, bias);
}

const char* gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::eigen: return "eigen";
    case GemmKernel::scalar: return "scalar";
    case GemmKernel::avx2: return "avx2";
    case GemmKernel::avx512: return "avx512";
  }
  return "?";
}

bool cpu_gemm_kernel_supported(GemmKernel k) { return gemm_packed::kernel_supported(k); }
bool cpu_gemm_bf16_dot_supported() { return gemm_packed::bf16_pairs_supported(); }
bool cpu_gemm_bf16_dot() { return bf16_dot_state().load(); }
void set_cpu_gemm_bf16_dot(bool on) {
  MG_CHECK(!on || gemm_packed::bf16_pairs_supported(), "set_cpu_gemm_bf16_dot: this CPU has no AVX512-BF16");
  bf16_dot_state().store(on);
}
GemmKernel cpu_gemm_kernel() { return kernel_state().load(); }
void set_cpu_gemm_kernel(GemmKernel k) {
  MG_CHECK(gemm_packed::kernel_supported(k), "set_cpu_gemm_kernel: this CPU does not run the ", gemm_kernel_name(k),
           " GEMM kernel");
  kernel_state().store(k);
}

#define MG_STR2(x) #x
#define MG_STR(x) MG_STR2(x)
const char* cpu_gemm_backend() {
  // One name per kernel and 16-bit path (the kernel may be switched, AMX turned off by tests).
  enum Bf16Path { kConverted, kVdpbf16ps, kAmx };
  static const std::array<std::array<std::string, 3>, 4> names = [] {
    const std::string eigen = "Eigen " MG_STR(EIGEN_WORLD_VERSION) "." MG_STR(EIGEN_MAJOR_VERSION) "." MG_STR(
        EIGEN_MINOR_VERSION);
    const std::string grid = " (single-threaded products on a fixed tile grid, run by memgrad's OpenMP threads)";
    const std::array<std::string, 3> bf16 = {"; bf16/f16 tiles converted to f32", "; bf16 tiles on vdpbf16ps",
                                             "; bf16 tiles on AMX (TDPBF16PS)"};
    std::array<std::array<std::string, 3>, 4> n;
    for (GemmKernel k : {GemmKernel::eigen, GemmKernel::scalar, GemmKernel::avx2, GemmKernel::avx512})
      for (int p = kConverted; p <= kAmx; ++p)
        n[size_t(k)][p] = (k == GemmKernel::eigen ? eigen + " for f32 and f64"
                                                  : std::string("memgrad packed f32 GEMM (") + gemm_kernel_name(k) +
                                                        " kernels, Eigen's summation order), " + eigen + " for f64") +
                          bf16[p] + grid;
    return n;
  }();
  const int path = native_amx() ? kAmx : native_bf16() ? kVdpbf16ps : kConverted;
  return names[size_t(cpu_gemm_kernel())][path].c_str();
}
#undef MG_STR
#undef MG_STR2

}  // namespace mg
