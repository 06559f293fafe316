// Building blocks shared by every CUDA kernel of memgrad (core/cuda and ops/cuda): the strided
// indexer that turns a linear element index into each operand's offset (broadcasting is a 0
// stride), dims coalesced on the host first; launch constants; and warp/block reductions that
// combine values in a fixed tree, so a result has the same bits on every run.
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>

#include "core/cuda/context.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace mg::cuda {

inline constexpr int kMaxDims = 12;      // after coalescing; more is an error naming the shape
inline constexpr int kThreads = 256;     // default block size of element-wise kernels

// Accumulators: f64 for f64, i64 for integers, f32 for f32/f16/bf16 (as the CPU kernels).
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_integral_v<T>, int64_t, float>>;

// Offsets of N operands for a linear index over `sizes` (row-major). Built on the host.
template <int N>
struct Indexer {
  int nd = 0;
  bool use32 = true;  // every index and offset fits 32 bits: cheaper division
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (use32) {
      uint32_t r = uint32_t(linear);
      for (int d = nd - 1; d >= 0; --d) {
        uint32_t s = uint32_t(sizes[d]);
        uint32_t q = r / s, i = r - q * s;
        r = q;
        for (int k = 0; k < N; ++k) off[k] += int64_t(i) * strides[k][d];
      }
    } else {
      int64_t r = linear;
      for (int d = nd - 1; d >= 0; --d) {
        int64_t q = r / sizes[d], i = r - q * sizes[d];
        r = q;
        for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
      }
    }
  }
};

// Drops size-1 dims and merges neighbours that are contiguous for every operand.
template <int N>
Indexer<N> make_indexer(const Shape& shape, const std::array<const int64_t*, N>& strides, const char* op) {
  Indexer<N> ix;
  int64_t sz[64];
  int64_t st[N][64];
  int nd = 0;
  MG_CHECK(shape.size() <= 64, op, ": too many dimensions ", shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && st[k][nd - 1] == strides[k][d] * shape[d];
      if (merge) {
        sz[nd - 1] *= shape[d];
        for (int k = 0; k < N; ++k) st[k][nd - 1] = strides[k][d];
        continue;
      }
    }
    sz[nd] = shape[d];
    for (int k = 0; k < N; ++k) st[k][nd] = strides[k][d];
    ++nd;
  }
  MG_CHECK(nd <= kMaxDims, op, ": shape ", shape_str(shape), " has ", nd, " non-mergeable dimensions on CUDA (at most ",
           kMaxDims, ")");
  ix.nd = nd;
  int64_t numel = numel_of(shape);
  bool small = numel < (int64_t(1) << 31);
  for (int d = 0; d < nd; ++d) {
    ix.sizes[d] = sz[d];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = st[k][d];
  }
  ix.use32 = small;
  return ix;
}

// ---- reductions in a fixed order --------------------------------------------------------------

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = (w > v || w != w) ? w : v;  // NaN wins, as in the CPU kernels
  }
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 A. The tree is fixed by blockDim, so the bits are the same on every run.
template <class A>
__device__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : A(0);
  return warp_sum(v);
}

template <class A>
__device__ A block_max(A v, A* shared, A lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : lowest;
  return warp_max(v);
}

}  // namespace mg::cuda
