// CUDA flash attention (Dao et al. 2022), the tiled path of ops/flash_attention.cpp on the GPU: no
// (T, T) tensor exists; a block holds one tile of scores, in shared memory, at a time.
//
// Tiling. A block is 128 threads, 16 row groups x 8 lanes, and works on an R x N tile (R = 16 RM
// rows, N = 8 CN columns: 64 x 64 in f32, 32 x 32 in f64). The operand rows a tile reads (q, k, v,
// dout; R or N rows of HS) are staged in shared memory, each row padded by one element so the 8
// lanes' reads of 8 different rows fall in different banks. Thread (ty, tx) owns the tile entries
// (ty RM + m, tx + 8 c) and, for each of its RM rows, the HS-long accumulator columns tx + 8 c
// (registers: HS <= kMaxHS). A row's statistics are combined across its 8 lanes by shuffles.
//  - forward: rows are queries, columns keys; a block per query tile loops over the key tiles:
//    S = scale q k^T, the online softmax (running max m and sum l per row; the output so far is
//    rescaled by exp(m_old - m_new)), out += P v. At the end out /= l and lse = m + log l.
//  - backward: D = rowsum(dout * out), one warp per row. Then dk and dv: a block per key tile (rows
//    are keys, columns queries) loops over the query tiles, recomputing P^T = exp(S^T - lse) and
//    dS^T = P^T (dP^T z - D) scale, adding dv += (P z)^T dout and dk += dS^T q. And dq: a block
//    per query tile loops over the key tiles, dq += dS k. P and dP are computed in both (7 tile
//    products where the CPU's one pass needs 5): the price of writing each gradient from one block.
//
// Determinism. Every output element is written once, by one thread of one block, and every sum
// has a fixed order: over HS and over a tile's columns in index order, over a row's 8 lanes by a
// fixed butterfly of shuffles, over tiles in tile order. No atomics: the same bits on every run.
// Dropout keeps weight (s, i, j) iff uniform(seed, offset + (s*T + i)*T + j) >= p, the uniform from
// word (pos & 3) of philox4x32(seed, 0, pos >> 2) (core/rng.h): the CPU's rule
// (ops/attention_common.h), so cpu and cuda drop the same weights.
#include <cmath>

#include "core/rng.h"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

constexpr int kRowGroups = 16, kLanes = 8, kBlockThreads = kRowGroups * kLanes;
constexpr int kMaxHS = 128;  // head sizes above this are an error (accumulators live in registers)

// Rows per thread (RM) and columns per lane (CN) of a tile: 64 x 64 in f32, 32 x 32 in f64 (the
// shared memory of a 128-wide head then fits an A100's 164 KiB in both).
template <class C>
struct TileShape;
template <>
struct TileShape<float> {
  static constexpr int RM = 4, CN = 8;
};
template <>
struct TileShape<double> {
  static constexpr int RM = 2, CN = 4;
};

// A (B, NH, T, HS) operand with a contiguous last dimension: element (b, h, t, x) at
// p[b*sb + h*sh + t*st + x]; slice(s) points at (b, h) = (s / NH, s % NH), as on the CPU.
template <class C>
struct Rows {
  C* p = nullptr;
  int64_t sb = 0, sh = 0, st = 0;
  __device__ C* slice(int64_t s, int64_t NH) const { return p + (s / NH) * sb + (s % NH) * sh; }
};
template <class C>
Rows<C> rows_of(const Tensor& t) {
  if (!t.defined()) return {};
  return {static_cast<C*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
}

// The dropout factor z of weight (s, i, j): 0 or 1 / (1 - p), at the CPU's stream position.
struct DropRule {
  float threshold = 0;  // p; 0: no dropout
  double keep = 1;      // 1 / (1 - p), rounded to C at use as the CPU does
  uint64_t seed = 0, offset = 0;
  __device__ bool kept(int64_t s, int64_t i, int64_t j, int64_t T) const {
    const uint64_t pos = offset + uint64_t((s * T + i) * T + j);
    return uint_to_unit_float(philox4x32(seed, 0, pos >> 2)[pos & 3]) >= threshold;
  }
};

template <class C>
struct Args {
  Rows<const C> q, k, v, out, dout;
  Rows<C> dst_out, dq, dk, dv;
  C* lse = nullptr;         // (S, T): written by forward, read by backward
  C* dsum = nullptr;        // (S, T): D = rowsum(dout * out), backward
  int64_t S, NH, T;
  int HS;
  bool causal;
  C scale;
  DropRule drop;
  int64_t tiles;            // tiles along T of the kernel's own rows
};

// Whether score (i, j) takes part: inside T, and not a future key when causal.
__device__ __forceinline__ bool valid(int64_t i, int64_t j, int64_t T, bool causal) {
  return i < T && j < T && (!causal || j <= i);
}

// This block's slice and the first of its own rows; consecutive blocks take one tile of consecutive
// slices. Causal tiles differ in work, so the heaviest go first (late_first: the query tiles of
// forward and dq see the most keys last along T; the key tiles of dk, dv the most queries first).
struct BlockTile {
  int64_t s, r0;
};
__device__ __forceinline__ BlockTile block_tile(int64_t S, int64_t tiles, int64_t R, bool late_first) {
  const int64_t b = blockIdx.x, t = b / S;
  return {b % S, (late_first ? tiles - 1 - t : t) * R};
}

// dst (n rows of HS, row stride HS + 1) = rows [r0, r0 + n) of src (row stride st), zeros past T.
template <class C>
__device__ void stage_rows(C* dst, const C* src, int64_t st, int64_t r0, int n, int64_t T, int HS) {
  for (int e = threadIdx.x; e < n * HS; e += blockDim.x) {
    const int r = e / HS, x = e - r * HS;
    dst[r * (HS + 1) + x] = r0 + r < T ? src[(r0 + r) * st + x] : C(0);
  }
}

// acc[m][c] = sum_x A[row0 + m][x] B[col0 + 8 c][x], x in order, over staged rows of HS.
template <int RM, int CN, class C>
__device__ __forceinline__ void tile_dots(const C* A, const C* B, int HS, int row0, int col0, C (&acc)[RM][CN]) {
  const int HSP = HS + 1;
#pragma unroll
  for (int m = 0; m < RM; ++m)
#pragma unroll
    for (int c = 0; c < CN; ++c) acc[m][c] = C(0);
  for (int x = 0; x < HS; ++x) {
    C a[RM], b[CN];
#pragma unroll
    for (int m = 0; m < RM; ++m) a[m] = A[(row0 + m) * HSP + x];
#pragma unroll
    for (int c = 0; c < CN; ++c) b[c] = B[(col0 + kLanes * c) * HSP + x];
#pragma unroll
    for (int m = 0; m < RM; ++m)
#pragma unroll
      for (int c = 0; c < CN; ++c) acc[m][c] += a[m] * b[c];
  }
}

// acc[m][xc] += sum_{j < n} W[row0 + m][j] X[j][lane + 8 xc], j in order; W has row stride ws, X
// is staged rows of HS. Columns past HS are left alone.
template <int RM, int XC, class C>
__device__ __forceinline__ void tile_accumulate(const C* W, int ws, const C* X, int HS, int n, int row0, int lane,
                                                C (&acc)[RM][XC]) {
  const int HSP = HS + 1;
  for (int j = 0; j < n; ++j) {
    C w[RM];
#pragma unroll
    for (int m = 0; m < RM; ++m) w[m] = W[(row0 + m) * ws + j];
#pragma unroll
    for (int xc = 0; xc < XC; ++xc) {
      const int x = lane + kLanes * xc;
      if (x < HS) {
        const C xv = X[j * HSP + x];
#pragma unroll
        for (int m = 0; m < RM; ++m) acc[m][xc] += w[m] * xv;
      }
    }
  }
}

// Max and sum over a row's 8 lanes (the low 3 bits of the lane id): a fixed butterfly, after which
// every lane holds the same bits (a + b == b + a).
template <class C>
__device__ __forceinline__ C lanes_max(C v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    const C w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v || w != w ? w : v;  // NaN wins, as on the CPU
  }
  return v;
}
template <class C>
__device__ __forceinline__ C lanes_sum(C v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Writes acc's rows r0 + row0 + m < T, columns < HS, into slice `dst` (row stride st).
template <int RM, int XC, class C>
__device__ __forceinline__ void store_rows(C* dst, int64_t st, int64_t r0, int row0, int lane, int64_t T, int HS,
                                           const C (&acc)[RM][XC]) {
#pragma unroll
  for (int m = 0; m < RM; ++m) {
    const int64_t r = r0 + row0 + m;
    if (r >= T) continue;
#pragma unroll
    for (int xc = 0; xc < XC; ++xc) {
      const int x = lane + kLanes * xc;
      if (x < HS) dst[r * st + x] = acc[m][xc];
    }
  }
}

template <class C>
size_t smem_elems(int R, int N, int HS, int extra) {
  return size_t(R + N) * size_t(HS + 1) + size_t(R) * size_t(N + 1) + size_t(extra);
}

// ---- forward: a block per query tile ------------------------------------------------------------

template <class C, int HSMAX>
__global__ void __launch_bounds__(kBlockThreads) flash_forward_kernel(const Args<C> a) {
  constexpr int RM = TileShape<C>::RM, CN = TileShape<C>::CN, R = kRowGroups * RM, N = kLanes * CN;
  constexpr int XC = HSMAX / kLanes;
  extern __shared__ __align__(16) unsigned char flash_smem[];
  const int HS = a.HS, HSP = HS + 1, tx = threadIdx.x % kLanes, row0 = (threadIdx.x / kLanes) * RM;
  C* Qs = reinterpret_cast<C*>(flash_smem);  // (R, HS + 1) queries
  C* Ks = Qs + R * HSP;                       // (N, HS + 1) keys
  C* Vs = Ks + N * HSP;                       // (N, HS + 1) values
  C* Ps = Vs + N * HSP;                       // (R, N + 1) the tile's weights, after dropout
  const BlockTile bt = block_tile(a.S, a.tiles, R, true);
  const int64_t s = bt.s, i0 = bt.r0, T = a.T;
  const C *ks = a.k.slice(s, a.NH), *vs = a.v.slice(s, a.NH);
  stage_rows(Qs, a.q.slice(s, a.NH), a.q.st, i0, R, T, HS);
  C mrun[RM], lrun[RM], o[RM][XC];
#pragma unroll
  for (int m = 0; m < RM; ++m) {
    mrun[m] = C(-INFINITY);
    lrun[m] = C(0);
#pragma unroll
    for (int xc = 0; xc < XC; ++xc) o[m][xc] = C(0);
  }
  const int64_t jend = a.causal ? (i0 + R < T ? i0 + R : T) : T;
  for (int64_t j0 = 0; j0 < jend; j0 += N) {
    __syncthreads();  // the previous tile's K, V and P are read by everyone
    stage_rows(Ks, ks, a.k.st, j0, N, T, HS);
    stage_rows(Vs, vs, a.v.st, j0, N, T, HS);
    __syncthreads();
    C sc[RM][CN];
    tile_dots(Qs, Ks, HS, row0, tx, sc);
#pragma unroll
    for (int m = 0; m < RM; ++m) {
      const int64_t i = i0 + row0 + m;
      C mx = C(-INFINITY);
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        sc[m][c] = valid(i, j0 + tx + kLanes * c, T, a.causal) ? sc[m][c] * a.scale : C(-INFINITY);
        mx = sc[m][c] > mx || sc[m][c] != sc[m][c] ? sc[m][c] : mx;
      }
      mx = lanes_max(mx);
      const C mnew = mrun[m] > mx || mrun[m] != mrun[m] ? mrun[m] : mx;
      const C corr = mrun[m] == C(-INFINITY) ? C(0) : ::exp(mrun[m] - mnew);  // 0 on the first tile
      C sum = 0;
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        sc[m][c] = sc[m][c] == C(-INFINITY) ? C(0) : ::exp(sc[m][c] - mnew);
        sum += sc[m][c];
      }
      lrun[m] = lrun[m] * corr + lanes_sum(sum);  // the sum of the weights before dropout
      mrun[m] = mnew;
#pragma unroll
      for (int xc = 0; xc < XC; ++xc) o[m][xc] *= corr;
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const int64_t j = j0 + tx + kLanes * c;
        C w = sc[m][c];
        if (a.drop.threshold > 0 && w != C(0)) w = a.drop.kept(s, i, j, T) ? w * C(a.drop.keep) : C(0);
        Ps[(row0 + m) * (N + 1) + tx + kLanes * c] = w;
      }
    }
    __syncthreads();
    const int cols = jend - j0 < N ? int(jend - j0) : N;  // P is 0 and V's rows are 0 past them
    tile_accumulate(Ps, N + 1, Vs, HS, cols, row0, tx, o);  // out += P v
  }
#pragma unroll
  for (int m = 0; m < RM; ++m) {
    const C inv = C(1) / lrun[m];
#pragma unroll
    for (int xc = 0; xc < XC; ++xc) o[m][xc] *= inv;
    const int64_t i = i0 + row0 + m;
    if (tx == 0 && i < T) a.lse[s * T + i] = mrun[m] + ::log(lrun[m]);
  }
  store_rows(a.dst_out.slice(s, a.NH), a.dst_out.st, i0, row0, tx, T, HS, o);
}

// ---- backward -------------------------------------------------------------------------------------

// D[s*T + t] = sum_x dout[t][x] out[t][x], one warp per row, lanes over x then a fixed tree.
template <class C>
__global__ void flash_row_dots_kernel(const Args<C> a) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.S * a.T) return;  // a whole warp: row is the same for its lanes
  const int lane = threadIdx.x % 32;
  const int64_t s = row / a.T, t = row % a.T;
  const C* g = a.dout.slice(s, a.NH) + t * a.dout.st;
  const C* o = a.out.slice(s, a.NH) + t * a.out.st;
  C acc = 0;
  for (int x = lane; x < a.HS; x += 32) acc += g[x] * o[x];
  acc = warp_sum(acc);
  if (lane == 0) a.dsum[row] = acc;
}

// dk and dv of one key tile (rows: keys; columns: queries), over the query tiles that see it.
template <class C, int HSMAX>
__global__ void __launch_bounds__(kBlockThreads) flash_backward_dkdv_kernel(const Args<C> a) {
  constexpr int RM = TileShape<C>::RM, CN = TileShape<C>::CN, R = kRowGroups * RM, N = kLanes * CN;
  constexpr int XC = HSMAX / kLanes;
  static_assert(RM * CN <= 32, "the kept-bits mask is one 32-bit word");
  extern __shared__ __align__(16) unsigned char flash_smem[];
  const int HS = a.HS, HSP = HS + 1, tx = threadIdx.x % kLanes, row0 = (threadIdx.x / kLanes) * RM;
  C* Ks = reinterpret_cast<C*>(flash_smem);  // (R, HS + 1) keys
  C* Vs = Ks + R * HSP;                       // (R, HS + 1) values (for dk)
  C* Qs = Vs + R * HSP;                       // (N, HS + 1) queries
  C* Gs = Qs + N * HSP;                       // (N, HS + 1) dout
  C* Ws = Gs + N * HSP;                       // (R, N + 1) dropped P^T, then dS^T
  C* Ls = Ws + R * (N + 1);                   // (N) lse of the query tile
  C* Ds = Ls + N;                             // (N) D of the query tile
  const bool want_dk = a.dk.p != nullptr, want_dv = a.dv.p != nullptr;
  const BlockTile bt = block_tile(a.S, a.tiles, R, false);
  const int64_t s = bt.s, j0 = bt.r0, T = a.T;
  const C *qs = a.q.slice(s, a.NH), *gs = a.dout.slice(s, a.NH);
  stage_rows(Ks, a.k.slice(s, a.NH), a.k.st, j0, R, T, HS);
  if (want_dk) stage_rows(Vs, a.v.slice(s, a.NH), a.v.st, j0, R, T, HS);
  C dk[RM][XC], dv[RM][XC];
#pragma unroll
  for (int m = 0; m < RM; ++m)
#pragma unroll
    for (int xc = 0; xc < XC; ++xc) dk[m][xc] = dv[m][xc] = C(0);
  for (int64_t i0 = a.causal ? j0 / N * N : 0; i0 < T; i0 += N) {  // causal: queries before j0 see none
    __syncthreads();  // the previous query tile is read by everyone
    stage_rows(Qs, qs, a.q.st, i0, N, T, HS);
    stage_rows(Gs, gs, a.dout.st, i0, N, T, HS);
    for (int r = threadIdx.x; r < N; r += blockDim.x) {
      const bool in = i0 + r < T;
      Ls[r] = in ? a.lse[s * T + i0 + r] : C(0);
      Ds[r] = in && want_dk ? a.dsum[s * T + i0 + r] : C(0);
    }
    __syncthreads();
    C p[RM][CN];  // P^T, before dropout
    tile_dots(Ks, Qs, HS, row0, tx, p);
    uint32_t kept = 0xffffffffu;  // bit m*CN + c: weight (i, j) survived dropout
#pragma unroll
    for (int m = 0; m < RM; ++m)
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const int64_t j = j0 + row0 + m, i = i0 + tx + kLanes * c;
        const bool ok = valid(i, j, T, a.causal);
        p[m][c] = ok ? ::exp(p[m][c] * a.scale - Ls[tx + kLanes * c]) : C(0);
        C w = p[m][c];
        if (a.drop.threshold > 0 && ok && !a.drop.kept(s, i, j, T)) {
          kept &= ~(1u << (m * CN + c));
          w = C(0);
        } else if (a.drop.threshold > 0) {
          w *= C(a.drop.keep);
        }
        Ws[(row0 + m) * (N + 1) + tx + kLanes * c] = w;
      }
    __syncthreads();
    const int rows = T - i0 < N ? int(T - i0) : N;
    if (want_dv) tile_accumulate(Ws, N + 1, Gs, HS, rows, row0, tx, dv);  // dv += (P z)^T dout
    if (!want_dk) continue;
    C dp[RM][CN];  // dP^T = v dout^T
    tile_dots(Vs, Gs, HS, row0, tx, dp);
#pragma unroll
    for (int m = 0; m < RM; ++m)
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        C g = dp[m][c];
        if (a.drop.threshold > 0) g = (kept >> (m * CN + c)) & 1u ? g * C(a.drop.keep) : C(0);
        dp[m][c] = p[m][c] * (g - Ds[tx + kLanes * c]) * a.scale;  // dS^T
      }
    __syncthreads();  // everyone is done reading the weights
#pragma unroll
    for (int m = 0; m < RM; ++m)
#pragma unroll
      for (int c = 0; c < CN; ++c) Ws[(row0 + m) * (N + 1) + tx + kLanes * c] = dp[m][c];
    __syncthreads();
    tile_accumulate(Ws, N + 1, Qs, HS, rows, row0, tx, dk);  // dk += dS^T q
  }
  if (want_dk) store_rows(a.dk.slice(s, a.NH), a.dk.st, j0, row0, tx, T, HS, dk);
  if (want_dv) store_rows(a.dv.slice(s, a.NH), a.dv.st, j0, row0, tx, T, HS, dv);
}

// dq of one query tile (rows: queries; columns: keys), over the key tiles it sees.
template <class C, int HSMAX>
__global__ void __launch_bounds__(kBlockThreads) flash_backward_dq_kernel(const Args<C> a) {
  constexpr int RM = TileShape<C>::RM, CN = TileShape<C>::CN, R = kRowGroups * RM, N = kLanes * CN;
  constexpr int XC = HSMAX / kLanes;
  extern __shared__ __align__(16) unsigned char flash_smem[];
  const int HS = a.HS, HSP = HS + 1, tx = threadIdx.x % kLanes, row0 = (threadIdx.x / kLanes) * RM;
  C* Qs = reinterpret_cast<C*>(flash_smem);  // (R, HS + 1) queries
  C* Gs = Qs + R * HSP;                       // (R, HS + 1) dout
  C* Ks = Gs + R * HSP;                       // (N, HS + 1) keys
  C* Vs = Ks + N * HSP;                       // (N, HS + 1) values
  C* Ws = Vs + N * HSP;                       // (R, N + 1) dS
  const BlockTile bt = block_tile(a.S, a.tiles, R, true);
  const int64_t s = bt.s, i0 = bt.r0, T = a.T;
  const C *ks = a.k.slice(s, a.NH), *vs = a.v.slice(s, a.NH);
  stage_rows(Qs, a.q.slice(s, a.NH), a.q.st, i0, R, T, HS);
  stage_rows(Gs, a.dout.slice(s, a.NH), a.dout.st, i0, R, T, HS);
  C lse[RM], D[RM], dq[RM][XC];
#pragma unroll
  for (int m = 0; m < RM; ++m) {
    const int64_t i = i0 + row0 + m;
    lse[m] = i < T ? a.lse[s * T + i] : C(0);
    D[m] = i < T ? a.dsum[s * T + i] : C(0);
#pragma unroll
    for (int xc = 0; xc < XC; ++xc) dq[m][xc] = C(0);
  }
  const int64_t jend = a.causal ? (i0 + R < T ? i0 + R : T) : T;
  for (int64_t j0 = 0; j0 < jend; j0 += N) {
    __syncthreads();  // the previous key tile and dS are read by everyone
    stage_rows(Ks, ks, a.k.st, j0, N, T, HS);
    stage_rows(Vs, vs, a.v.st, j0, N, T, HS);
    __syncthreads();
    C p[RM][CN], dp[RM][CN];
    tile_dots(Qs, Ks, HS, row0, tx, p);
    tile_dots(Gs, Vs, HS, row0, tx, dp);
#pragma unroll
    for (int m = 0; m < RM; ++m)
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const int64_t i = i0 + row0 + m, j = j0 + tx + kLanes * c;
        const bool ok = valid(i, j, T, a.causal);
        const C w = ok ? ::exp(p[m][c] * a.scale - lse[m]) : C(0);
        C g = dp[m][c];
        if (a.drop.threshold > 0) g = ok && a.drop.kept(s, i, j, T) ? g * C(a.drop.keep) : C(0);
        Ws[(row0 + m) * (N + 1) + tx + kLanes * c] = w * (g - D[m]) * a.scale;  // dS
      }
    __syncthreads();
    const int cols = jend - j0 < N ? int(jend - j0) : N;
    tile_accumulate(Ws, N + 1, Ks, HS, cols, row0, tx, dq);  // dq += dS k
  }
  store_rows(a.dq.slice(s, a.NH), a.dq.st, i0, row0, tx, T, HS, dq);
}

// ---- host side --------------------------------------------------------------------------------------

void check_operand(const Tensor& t, DType c, int64_t dims, const char* what) {
  if (!t.defined()) return;
  const bool last_contiguous = t.dim() == dims && (dims == 3 ? t.is_contiguous() : t.stride(3) == 1);
  MG_CHECK(t.dtype() == c && last_contiguous, "scaled_dot_product_attention: internal: ", what,
           " must be ", c, (dims == 3 ? ", contiguous" : " with a contiguous last dimension"), " on CUDA");
}

template <class C>
Args<C> make_args(const FlashAttentionDims& d, int64_t rows_per_tile) {
  Args<C> a;
  a.S = d.B * d.NH;
  a.NH = d.NH;
  a.T = d.T;
  a.HS = int(d.HS);
  a.causal = d.causal;
  a.scale = C(d.scale);
  if (d.p > 0) a.drop = {.threshold = float(d.p), .keep = 1.0 / (1.0 - d.p), .seed = d.seed, .offset = d.offset};
  a.tiles = (d.T + rows_per_tile - 1) / rows_per_tile;
  MG_CHECK(a.S * a.tiles < (int64_t(1) << 31), "scaled_dot_product_attention: ", a.S, " slices x ", a.tiles,
           " tiles is too many blocks for one CUDA launch");
  return a;
}

// Launches kernel<<<S * tiles, 128, bytes>>>, raising the block's shared-memory limit when needed.
template <class K, class A>
void launch_tiles(int dev, K kernel, const A& a, size_t bytes, const char* name) {
  const size_t limit = properties(dev).sharedMemPerBlockOptin;
  MG_CHECK(bytes <= limit, "scaled_dot_product_attention: the CUDA flash kernel ", name, " needs ", bytes,
           " bytes of shared memory for head size ", a.HS, ", this GPU allows ", limit,
           "; hint: scaled_dot_product_attention_math has no such limit");
  if (bytes > 48 * 1024)
    MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  kernel<<<unsigned(a.S * a.tiles), kBlockThreads, bytes, stream(dev)>>>(a);
  MG_CUDA_CHECK_LAUNCH(name);
}

// fn(std::integral_constant<int, HSMAX>) for the smallest instantiated HSMAX >= HS.
template <class F>
void with_head_bound(int64_t HS, F fn) {
  MG_CHECK(HS <= kMaxHS, "scaled_dot_product_attention: head size ", HS, " is above the ", kMaxHS,
           " the CUDA flash kernels support; hint: scaled_dot_product_attention_math has no such limit");
  if (HS <= 32) fn(std::integral_constant<int, 32>());
  else if (HS <= 64) fn(std::integral_constant<int, 64>());
  else fn(std::integral_constant<int, 128>());
}

template <class C>
void forward_typed(int dev, const FlashAttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse) {
  constexpr int R = kRowGroups * TileShape<C>::RM, N = kLanes * TileShape<C>::CN;
  Args<C> a = make_args<C>(d, R);
  a.q = rows_of<const C>(q);
  a.k = rows_of<const C>(k);
  a.v = rows_of<const C>(v);
  a.dst_out = rows_of<C>(out);
  a.lse = static_cast<C*>(lse.data_ptr());
  const size_t bytes = smem_elems<C>(R, N, a.HS, N * (a.HS + 1)) * sizeof(C);  // Q, K, P + V
  with_head_bound(d.HS, [&](auto hs) {
    launch_tiles(dev, flash_forward_kernel<C, decltype(hs)::value>, a, bytes, "flash_forward_kernel");
  });
}

template <class C>
void backward_typed(int dev, const FlashAttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dsum, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv) {
  constexpr int R = kRowGroups * TileShape<C>::RM, N = kLanes * TileShape<C>::CN;
  Args<C> a = make_args<C>(d, R);
  a.q = rows_of<const C>(q);
  a.k = rows_of<const C>(k);
  a.v = rows_of<const C>(v);
  a.out = rows_of<const C>(out);
  a.dout = rows_of<const C>(dout);
  a.dq = rows_of<C>(dq);
  a.dk = rows_of<C>(dk);
  a.dv = rows_of<C>(dv);
  a.lse = static_cast<C*>(lse.data_ptr());
  a.dsum = dsum.defined() ? static_cast<C*>(dsum.data_ptr()) : nullptr;
  if (dq.defined() || dk.defined()) {  // D = rowsum(dout * out)
    constexpr int kRowsPerBlock = 256 / 32;
    const int64_t blocks = (a.S * a.T + kRowsPerBlock - 1) / kRowsPerBlock;
    MG_CHECK(blocks < (int64_t(1) << 31), "scaled_dot_product_attention: too many rows for one CUDA launch");
    flash_row_dots_kernel<C><<<unsigned(blocks), 256, 0, stream(dev)>>>(a);
    MG_CUDA_CHECK_LAUNCH("flash_row_dots_kernel");
  }
  // Both gradient kernels stage two tiles of R rows and two of N rows, plus a weights tile.
  const size_t bytes = smem_elems<C>(R, N, a.HS, (R + N) * (a.HS + 1) + 2 * N) * sizeof(C);
  with_head_bound(d.HS, [&](auto hs) {
    constexpr int H = decltype(hs)::value;
    if (dk.defined() || dv.defined())
      launch_tiles(dev, flash_backward_dkdv_kernel<C, H>, a, bytes, "flash_backward_dkdv_kernel");
    if (dq.defined())  // R query rows per block: as many tiles as dk and dv's R key rows
      launch_tiles(dev, flash_backward_dq_kernel<C, H>, a, bytes, "flash_backward_dq_kernel");
  });
}

}  // namespace

void flash_attention_forward(const FlashAttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse) {
  if (d.B * d.NH == 0 || d.T == 0 || d.HS == 0) return;
  const DType c = q.dtype();
  for (const Tensor* t : {&q, &k, &v, &out}) check_operand(*t, c, 4, "q, k, v and out");
  check_operand(lse, c, 3, "lse");
  const int dev = q.device().index;
  DeviceGuard g(dev);
  if (c == DType::f32) forward_typed<float>(dev, d, q, k, v, out, lse);
  else if (c == DType::f64) forward_typed<double>(dev, d, q, k, v, out, lse);
  else MG_THROW("scaled_dot_product_attention: internal: compute dtype ", c, " on CUDA (expected f32 or f64)");
}

void flash_attention_backward(const FlashAttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dsum,
                              const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  if (d.B * d.NH == 0 || d.T == 0 || d.HS == 0) return;
  const DType c = q.dtype();
  for (const Tensor* t : {&q, &k, &v, &out, &dout, &dq, &dk, &dv}) check_operand(*t, c, 4, "attention operands");
  check_operand(lse, c, 3, "lse");
  check_operand(dsum, c, 3, "the row sums D");
  MG_CHECK(!(dq.defined() || dk.defined()) || (v.defined() && dsum.defined()),
           "scaled_dot_product_attention backward: internal: dq and dk need v and D");
  const int dev = q.device().index;
  DeviceGuard g(dev);
  if (c == DType::f32) backward_typed<float>(dev, d, q, k, v, out, lse, dout, dsum, dq, dk, dv);
  else if (c == DType::f64) backward_typed<double>(dev, d, q, k, v, out, lse, dout, dsum, dq, dk, dv);
  else MG_THROW("scaled_dot_product_attention backward: internal: compute dtype ", c, " on CUDA (expected f32 or f64)");
}

}  // namespace mg::cuda
