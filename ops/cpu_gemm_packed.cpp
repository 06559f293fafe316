// The packed GEMM's driver: Eigen's blocking, op(A) and op(B) packed into register-tile slivers,
// the micro-kernels over them, and the few columns Eigen sums with its "swapped" kernel done here
// in plain C++. Plus the scalar micro-kernels (the fallback, and the reference in tests).
//
// Note [Eigen's summation order]. Float sums depend on their order, and memgrad's losses were
// pinned with Eigen 3.4's GEMM, so this GEMM sums as Eigen does, element by element. Eigen computes
// a row-major C = op(A) op(B) as the column-major C^T = op(B)^T op(A)^T: its "rows" are our N
// columns, its "cols" our M rows. It blocks k by kc (and our columns by mc, our rows by nc) with
// computeProductBlockingSizes, and for each k block adds alpha * acc onto C with one FMA, acc being
// a register sum over the block's k that starts at 0. How acc sums depends on where the column sits
// in its mc block (P = Eigen's float packet size, 16 with AVX-512, 8 with AVX2):
//  - columns before p2 (the 3P- and 2P-wide panels): one FMA chain over k, `sequential`;
//  - columns in [p2, pq) (the P, P/2, P/4-wide panels): two chains, even and odd k, over the first
//    kc & ~7 steps, added, then the rest of k on the first, `even_odd` (Eigen's C/D registers);
//    except in the last nc % 4 rows of an nc block, which are sequential;
//  - the last actual_mc % 4 columns: Eigen's swapped kernel, with P lanes spanning (k, 4 rows) and
//    four chains folded by halves (swapped_columns below), or a sequential chain in tail rows.
// The tests compare this GEMM with Eigen's bit for bit on many shapes, for every micro-kernel.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 inside Eigen's headers
#endif
#include "ops/cpu_gemm_packed.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"

namespace mg::gemm_packed {
namespace {

namespace ei = Eigen::internal;
using Traits = ei::gebp_traits<float, float>;
using HalfTraits = ei::gebp_traits<float, float, false, false, Eigen::Architecture::Target, ei::GEBPPacketHalf>;
using QuarterTraits = ei::gebp_traits<float, float, false, false, Eigen::Architecture::Target, ei::GEBPPacketQuarter>;
constexpr int64_t kP = Traits::LhsProgress, kPh = HalfTraits::LhsProgress, kPq = QuarterTraits::LhsProgress;
// The order emulated here is Eigen 3.4's gebp with FMA: nr = 4, mr = 3 packets of 4, 8 or 16
// lanes. A build whose Eigen has no FMA (no -march=native on x86) multiplies and adds apart:
// there every product stays with Eigen (handles() is false).
#if defined(EIGEN_VECTORIZE_FMA)
constexpr bool kEigenOrder = Traits::nr == 4 && Traits::mr == 3 * kP && (kP == 4 || kP == 8 || kP == 16);
#else
constexpr bool kEigenOrder = false;
#endif

// Eigen's k, column and row blocks of a product (its GEMM for a row-major destination).
Blocking eigen_blocking(int64_t M, int64_t N, int64_t K) {
  Eigen::Index kc = K, mc = N, nc = M;
  ei::computeProductBlockingSizes<float, float, 1>(kc, mc, nc, Eigen::Index(1));
  return {kc, std::min<int64_t>(mc, N), std::min<int64_t>(nc, M)};
}

// Where an mc block of `cols` columns changes its summation (Note [Eigen's summation order]).
struct Segments {
  int64_t p2, pq;  // sequential [0, p2), even_odd [p2, pq), swapped [pq, cols)
};
Segments segments(int64_t cols) {
  const int64_t p3 = cols / (3 * kP) * (3 * kP);
  const int64_t p2 = p3 + (cols - p3) / (2 * kP) * (2 * kP);
  const int64_t p1 = p2 + (cols - p2) / kP * kP;
  const int64_t ph = p1 + (cols - p1) / kPh * kPh;
  const int64_t pq = ph + (cols - ph) / kPq * kPq;
  return {p2, pq};
}

// Row-major views of op(A) (M, K) and op(B) (K, N).
struct OpA {
  const float* p;
  int64_t ld;
  bool t;
  float at(int64_t i, int64_t k) const { return t ? p[k * ld + i] : p[i * ld + k]; }
};
struct OpB {
  const float* p;
  int64_t ld;
  bool t;
  float at(int64_t k, int64_t j) const { return t ? p[j * ld + k] : p[k * ld + j]; }
};

// Per-thread packing buffers, grown to the largest need and kept (Note [GEMM packing buffers]).
// Note [GEMM packing buffers]: the packed slivers of one k block (a few hundred KiB per thread,
// sized to stay in L2) live outside memgrad's allocator, as Eigen's own packing blocks did: they
// are the GEMM's registers spilled, not tensors, and the meta device predicts peaks without them.
struct Scratch {
  std::unique_ptr<float[]> a, b;
  int64_t a_size = 0, b_size = 0;
  float* get_a(int64_t n) { return grow(a, a_size, n); }
  float* get_b(int64_t n) { return grow(b, b_size, n); }

 private:
  static float* grow(std::unique_ptr<float[]>& p, int64_t& size, int64_t n) {
    if (n > size) {
      p.reset(new float[size_t(n)]);
      size = n;
    }
    return p.get();
  }
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

constexpr int64_t kPanelFloats = 96 * 1024;  // each packed chunk of op(B) stays within ~384 KiB (L2)
constexpr int64_t kMaxAFloats = 256 * 1024;  // op(A) blocks of several tiles' rows stay within ~1 MiB

// op(B)'s columns [j0, j0 + cols) over k [k0, k0 + kc) into slivers of nr columns: op(B)(k, j) is
// B[j * ld + k] (stored rows are op(B)'s columns) or B[k * ld + j].
void pack_b(const MicroKernels& mk, float* dst, const OpB& b, int64_t k0, int64_t kc, int64_t j0, int64_t cols) {
  if (b.t) mk.pack_b_transposing(dst, b.p + j0 * b.ld + k0, b.ld, cols, kc);
  else mk.pack_b_copying(dst, b.p + k0 * b.ld + j0, b.ld, cols, kc);
}

// op(A)'s rows [i0, i0 + rows) over k [k0, k0 + kc) into slivers of mr rows: op(A)(i, k) is
// A[k * ld + i] (stored rows are op(A)'s columns) or A[i * ld + k].
void pack_a(const MicroKernels& mk, float* dst, const OpA& a, int64_t i0, int64_t rows, int64_t k0, int64_t kc) {
  if (a.t) mk.pack_a_copying(dst, a.p + k0 * a.ld + i0, a.ld, rows, kc);
  else mk.pack_a_transposing(dst, a.p + i0 * a.ld + k0, a.ld, rows, kc);
}

// What C held before this k block's acc is added: C itself, 0, beta * C or the bias (see Init).
inline float old_value(const float* c, Init init, float beta, const float* bias) {
  switch (init) {
    case Init::load: return *c;
    case Init::zero: return 0.0f;
    case Init::scale: return beta * *c;
    case Init::bias: return *bias;
  }
  return *c;
}

struct Product {
  OpA a;
  OpB b;
  float alpha, beta;
  float* C;
  int64_t ldc;
  const float* bias;  // (N) or null
};

// The micro-tiles of rows [lo, hi) of C against one packed sliver of op(B) (t.b, t.nr set), in
// `order`. `ap` holds op(A)'s rows packed from row 0 in slivers of mk.mr; a range may start inside
// a sliver (the kernel reads its rows at a_step = mk.mr from there). c: C at row 0 of `ap`.
void run_rows(const MicroKernels& mk, MicroTile& t, const float* ap, Order order, int64_t lo, int64_t hi, float* c) {
  const int o = order == Order::even_odd, w = t.nr <= mk.narrow_nr;
  const int max_rows = mk.max_rows[o][w];
  for (int64_t i = lo; i < hi;) {
    const int64_t off = i % mk.mr;
    const int rows = int(std::min<int64_t>({max_rows, mk.mr - off, hi - i}));
    t.a = ap + (i - off) * t.kc + off;
    t.c = c + i * t.ldc;
    t.mr = rows;
    mk.kernel[o][w][rows](t);
    i += rows;
  }
}

// The rows a column block meets: tiles of one column range, rows [a0, a0 + rows) of the packed
// op(A) block each, with their own Eigen row blocking nc.
struct RowSpan {
  int64_t a0, rows, nc;
};

// One k block of the columns [j0, j0 + cols) (of an mc block of every tile in `spans`), all summed
// in `order` (but the last nc % 4 rows of each nc block sequentially: Note [Eigen's summation
// order]), against op(A)'s rows packed in `ap` from row `lo` of C on. op(B) is packed here once, a
// chunk of columns at a time, for all the spans.
void run_columns(const MicroKernels& mk, const Product& p, const float* ap, int64_t lo,
                 const std::vector<RowSpan>& spans, Order order, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
                 Init init) {
  if (cols <= 0) return;
  const int64_t ncb = std::max<int64_t>(mk.nr, kPanelFloats / kc / mk.nr * mk.nr);
  float* bp = scratch().get_b(kc * ((std::min(ncb, cols) + mk.nr - 1) / mk.nr * mk.nr));
  MicroTile t{};
  t.kc = kc;
  t.a_step = mk.mr;
  t.ldc = p.ldc;
  t.alpha = p.alpha;
  t.beta = p.beta;
  t.init = init;
  for (int64_t jc = 0; jc < cols; jc += ncb) {
    const int64_t nb = std::min(ncb, cols - jc);
    pack_b(mk, bp, p.b, k0, kc, j0 + jc, nb);
    for (const RowSpan& sp : spans) {
      // A sliver of rows stays in L1 while it meets every packed sliver of columns.
      for (int64_t r0 = sp.a0; r0 < sp.a0 + sp.rows; r0 = (r0 / mk.mr + 1) * mk.mr) {
        const int64_t r1 = std::min(sp.a0 + sp.rows, (r0 / mk.mr + 1) * mk.mr);
        for (int64_t jr = 0; jr < nb; jr += mk.nr) {
          t.b = bp + jr * kc;
          t.nr = int(std::min<int64_t>(mk.nr, nb - jr));
          t.bias = p.bias ? p.bias + j0 + jc + jr : nullptr;
          float* c = p.C + lo * p.ldc + j0 + jc + jr;
          if (order == Order::sequential) {
            run_rows(mk, t, ap, order, r0, r1, c);
            continue;
          }
          // even_odd up to each nc block's last multiple of 4 rows, sequential after it.
          for (int64_t i = r0; i < r1;) {
            const int64_t block = sp.a0 + (i - sp.a0) / sp.nc * sp.nc;
            const int64_t end4 = block + std::min(sp.nc, sp.a0 + sp.rows - block) / 4 * 4;
            const int64_t stop = std::min(r1, i < end4 ? end4 : block + sp.nc);
            run_rows(mk, t, ap, i < end4 ? Order::even_odd : Order::sequential, i, stop, c);
            i = stop;
          }
        }
      }
    }
  }
}

// Eigen's swapped kernel for the last columns of an mc block (Note [Eigen's summation order]):
// for 4 rows at once, P lanes hold (k step kk, row r) at lane kk * 4 + r for spk = P / 4 steps of
// k; four such chains take turns over groups of spk steps, are added as (C0 + C1) + (C2 + C3),
// take the leftover groups, fold to 4 lanes by halves (lane l + lane l + w/2), and take the last
// k < spk on the 4 lanes. Rows past the nc block's multiple of 4 sum one plain chain.
void swapped_columns(const Product& p, int64_t M, int64_t nc, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
                     Init init) {
  constexpr int64_t spk = std::max<int64_t>(1, kP / 4);
  static_assert(kP <= 16, "lanes of at most 16");
  const int64_t endk = kc / spk * spk, endk4 = kc / (spk * 4) * (spk * 4);
  for (int64_t j = j0; j < j0 + cols; ++j) {
    for (int64_t r2 = 0; r2 < M; r2 += nc) {
      const int64_t rn = std::min(nc, M - r2), r4 = rn / 4 * 4;
      for (int64_t i = r2; i < r2 + r4; i += 4) {
        float acc[4][kP] = {};
        int64_t k = 0;
        for (; k < endk4; k += 4 * spk)
          for (int q = 0; q < 4; ++q)
            for (int64_t l = 0; l < kP; ++l) {
              const int64_t kk = k0 + k + q * spk + l / 4;
              acc[q][l] = std::fma(p.a.at(i + l % 4, kk), p.b.at(kk, j), acc[q][l]);
            }
        float lane[kP];
        for (int64_t l = 0; l < kP; ++l) lane[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
        for (; k < endk; k += spk)
          for (int64_t l = 0; l < kP; ++l) {
            const int64_t kk = k0 + k + l / 4;
            lane[l] = std::fma(p.a.at(i + l % 4, kk), p.b.at(kk, j), lane[l]);
          }
        for (int64_t w = kP; w > 4; w /= 2)
          for (int64_t l = 0; l < w / 2; ++l) lane[l] = lane[l] + lane[l + w / 2];
        for (int64_t kk = k0 + endk; kk < k0 + kc; ++kk)
          for (int r = 0; r < 4; ++r) lane[r] = std::fma(p.a.at(i + r, kk), p.b.at(kk, j), lane[r]);
        for (int r = 0; r < 4; ++r) {
          float* c = p.C + (i + r) * p.ldc + j;
          *c = std::fma(lane[r], p.alpha, old_value(c, init, p.beta, p.bias ? p.bias + j : nullptr));
        }
      }
      for (int64_t i = r2 + r4; i < r2 + rn; ++i) {
        float acc = 0;
        for (int64_t kk = k0; kk < k0 + kc; ++kk) acc = std::fma(p.a.at(i, kk), p.b.at(kk, j), acc);
        float* c = p.C + i * p.ldc + j;
        *c = std::fma(p.alpha, acc, old_value(c, init, p.beta, p.bias ? p.bias + j : nullptr));
      }
    }
  }
}

// The scalar micro-kernels: any mr <= kScalarMr rows, nr <= kScalarNr columns.
constexpr int kScalarMr = 4, kScalarNr = 16;

template <Order O>
void scalar_kernel(const MicroTile& t) {
  float acc[kScalarMr][kScalarNr] = {}, odd[kScalarMr][kScalarNr] = {};
  const int64_t peeled = O == Order::even_odd ? t.kc & ~int64_t(7) : 0;
  const float* a = t.a;
  const float* b = t.b;
  for (int64_t k = 0; k < t.kc; ++k, a += t.a_step, b += kScalarNr) {
    auto& dst = (O == Order::even_odd && k < peeled && (k & 1)) ? odd : acc;
    for (int i = 0; i < t.mr; ++i)
      for (int j = 0; j < kScalarNr; ++j) dst[i][j] = std::fma(a[i], b[j], dst[i][j]);
    if (O == Order::even_odd && k + 1 == peeled)
      for (int i = 0; i < t.mr; ++i)
        for (int j = 0; j < kScalarNr; ++j) acc[i][j] = acc[i][j] + odd[i][j];
  }
  for (int i = 0; i < t.mr; ++i)
    for (int j = 0; j < t.nr; ++j) {
      float* c = t.c + i * t.ldc + j;
      *c = std::fma(acc[i][j], t.alpha, old_value(c, t.init, t.beta, t.bias ? t.bias + j : nullptr));
    }
}

template <int W>
void scalar_transposing(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  for (int64_t s = 0; s < n; s += W, dst += kc * W)
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t r = 0; r < W; ++r) dst[k * W + r] = s + r < n ? src[(s + r) * ld + k] : 0.0f;
}
template <int W>
void scalar_copying(float* dst, const float* src, int64_t ld, int64_t n, int64_t kc) {
  for (int64_t s = 0; s < n; s += W, dst += kc * W)
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t r = 0; r < W; ++r) dst[k * W + r] = s + r < n ? src[k * ld + s + r] : 0.0f;
}

}  // namespace

const MicroKernels& scalar_kernels() {
  static const MicroKernels k = [] {
    MicroKernels m{};
    m.kind = GemmKernel::scalar;
    m.mr = kScalarMr;
    m.nr = kScalarNr;
    m.narrow_nr = 0;  // one kernel for any width
    set_kernels<kScalarMr>(m, 0, 0, [](auto) { return &scalar_kernel<Order::sequential>; });
    set_kernels<kScalarMr>(m, 1, 0, [](auto) { return &scalar_kernel<Order::even_odd>; });
    m.pack_a_transposing = &scalar_transposing<kScalarMr>;
    m.pack_a_copying = &scalar_copying<kScalarMr>;
    m.pack_b_transposing = &scalar_transposing<kScalarNr>;
    m.pack_b_copying = &scalar_copying<kScalarNr>;
    return m;
  }();
  return k;
}

bool kernel_supported(GemmKernel k) {
#if defined(__x86_64__) || defined(_M_X64)
  if (k == GemmKernel::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (k == GemmKernel::avx512) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
  if (k == GemmKernel::avx2 || k == GemmKernel::avx512) return false;
#endif
  return true;
}

bool handles(int64_t M, int64_t N, int64_t K) {
  // Eigen takes M == 1 or N == 1 to its GEMV and K + M + N < 20 to its coefficient-wise product.
  return kEigenOrder && M >= 2 && N >= 2 && K >= 1 && K + M + N >= 20;
}

Blocking blocking(int64_t M, int64_t N, int64_t K) { return eigen_blocking(M, N, K); }

// sgemm_tiles on n consecutive tiles whose op(A) rows fit one packed block.
void run_tiles(const MicroKernels& mk, Transpose ta, Transpose tb, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias, const Tile* tiles,
               size_t n) {
  MG_INTERNAL_ASSERT(n > 0, "gemm_packed::sgemm_tiles: no tiles");
  MG_INTERNAL_ASSERT(bias == nullptr || beta == 1.0f, "gemm_packed::sgemm: a bias needs beta = 1");
  const int64_t kcb = tiles[0].bl.kc;
  int64_t lo = tiles[0].r0, hi = lo;
  for (size_t i = 0; i < n; ++i) {
    const Tile& tl = tiles[i];
    MG_INTERNAL_ASSERT(handles(tl.rows, tl.cols, K) && tl.bl.kc == kcb, "gemm_packed::sgemm_tiles: tile (", tl.rows,
                       ", ", tl.cols, ") with k block ", tl.bl.kc, " cannot share k blocks of ", kcb);
    lo = std::min(lo, tl.r0);
    hi = std::max(hi, tl.r0 + tl.rows);
  }
  const Product p{{A, lda, ta == Transpose::yes}, {B, ldb, tb == Transpose::yes}, alpha, beta, C, ldc, bias};
  // Column groups: tiles of one column range and mc blocking share each packed chunk of op(B); a
  // group is led by its first tile.
  auto same_columns = [&](size_t i, size_t j) {
    return tiles[i].c0 == tiles[j].c0 && tiles[i].cols == tiles[j].cols && tiles[i].bl.mc == tiles[j].bl.mc;
  };
  auto leader = [&](size_t i) {
    size_t j = 0;
    while (!same_columns(j, i)) ++j;
    return j;
  };
  thread_local std::vector<RowSpan> spans;  // reused: no allocation per product
  // Per element only the order of the k blocks matters, so k blocks run outermost and op(A)'s
  // rows are packed once per k block for every tile and column block (+ mk.mr floats of slack:
  // a kernel starting inside the last sliver reads its full height).
  float* ap = scratch().get_a(kcb * ((hi - lo + mk.mr - 1) / mk.mr * mk.mr) + mk.mr);
  for (int64_t k2 = 0; k2 < K; k2 += kcb) {
    const int64_t kc = std::min(kcb, K - k2);
    const Init init = k2 > 0                ? Init::load
                      : bias != nullptr     ? Init::bias
                      : beta == 1.0f        ? Init::load
                      : beta == 0.0f        ? Init::zero
                                            : Init::scale;
    pack_a(mk, ap, p.a, lo, hi - lo, k2, kc);
    for (size_t g = 0; g < n; ++g) {
      if (leader(g) != g) continue;
      const Tile& t0 = tiles[g];
      spans.clear();
      for (size_t i = g; i < n; ++i)
        if (same_columns(g, i)) spans.push_back({tiles[i].r0 - lo, tiles[i].rows, tiles[i].bl.nc});
      for (int64_t i2 = 0; i2 < t0.cols; i2 += t0.bl.mc) {
        const int64_t cols = std::min(t0.bl.mc, t0.cols - i2), j0 = t0.c0 + i2;
        const Segments seg = segments(cols);
        run_columns(mk, p, ap, lo, spans, Order::sequential, j0, seg.p2, k2, kc, init);
        run_columns(mk, p, ap, lo, spans, Order::even_odd, j0 + seg.p2, seg.pq - seg.p2, k2, kc, init);
        if (seg.pq == cols) continue;
        for (size_t i = g; i < n; ++i) {  // C and op(A) from the tile's first row on
          if (!same_columns(g, i)) continue;
          const Tile& tl = tiles[i];
          Product pt = p;
          pt.a.p = p.a.t ? p.a.p + tl.r0 : p.a.p + tl.r0 * p.a.ld;
          pt.C = p.C + tl.r0 * p.ldc;
          swapped_columns(pt, tl.rows, tl.bl.nc, j0 + seg.pq, cols - seg.pq, k2, kc, init);
        }
      }
    }
  }
}

void sgemm_tiles(const MicroKernels& mk, Transpose ta, Transpose tb, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias,
                 const Tile* tiles, size_t n) {
  // Consecutive tiles of one grid row share its rows; rows are gathered while the packed op(A)
  // block stays within kMaxAFloats (always at least one row of tiles).
  size_t first = 0;
  int64_t lo = 0, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    const Tile& tl = tiles[i];
    const bool new_row = i > first && tl.r0 != tiles[i - 1].r0;
    const int64_t nlo = i == first ? tl.r0 : std::min(lo, tl.r0);
    const int64_t nhi = i == first ? tl.r0 + tl.rows : std::max(hi, tl.r0 + tl.rows);
    if (new_row && (nhi - nlo) * tl.bl.kc > kMaxAFloats) {
      run_tiles(mk, ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, tiles + first, i - first);
      first = i;
      lo = tl.r0, hi = tl.r0 + tl.rows;
    } else {
      lo = nlo, hi = nhi;
    }
  }
  if (n > first) run_tiles(mk, ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, tiles + first, n - first);
}

void sgemm(const MicroKernels& mk, Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const float* bias) {
  MG_INTERNAL_ASSERT(handles(M, N, K), "gemm_packed::sgemm: sizes M=", M, " N=", N, " K=", K,
                     " belong to Eigen's GEMV or coefficient-wise product");
  const Tile tile{0, M, 0, N, eigen_blocking(M, N, K)};
  run_tiles(mk, ta, tb, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, &tile, 1);
}

}  // namespace mg::gemm_packed
