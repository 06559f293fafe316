// Helpers for the "one block per row" kernels (softmax, cross-entropy, layer_norm): the block
// size for a row length, and an online (max, sum of exp) pair whose merge is exact for -inf
// (masked attention scores), so softmax statistics take one pass over the row instead of two.
#pragma once
#include <cmath>

#include "core/cuda/kernel_utils.cuh"

namespace mg::cuda {

// Threads per row block: a multiple of 32, at most 512, no more than the row can use.
inline int row_threads(int64_t n) { return n >= 2048 ? 512 : n >= 512 ? 256 : n >= 128 ? 128 : n > 32 ? 64 : 32; }

template <class S>
struct MaxSum {
  S m;  // running max (-inf: nothing seen)
  S s;  // sum of exp(x - m)
};

template <class S>
__device__ __forceinline__ MaxSum<S> max_sum_add(MaxSum<S> a, S x) {
  if (x == -INFINITY) return a;  // contributes exp(-inf) = 0, and -inf - -inf would be NaN
  if (x > a.m) return {x, a.s * ::exp(a.m - x) + S(1)};
  if (x != x) return {x, x};  // NaN poisons the row, as on the CPU
  return {a.m, a.s + ::exp(x - a.m)};
}

template <class S>
__device__ __forceinline__ MaxSum<S> max_sum_merge(MaxSum<S> a, MaxSum<S> b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  if (a.m != a.m || b.m != b.m) return {a.m + b.m, a.s + b.s};  // NaN
  S m = a.m > b.m ? a.m : b.m;
  return {m, a.s * ::exp(a.m - m) + b.s * ::exp(b.m - m)};
}

// Block-wide merge in a fixed tree; every thread gets the result. shared: 32 entries.
template <class S>
__device__ MaxSum<S> block_max_sum(MaxSum<S> v, MaxSum<S>* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<S> w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = max_sum_merge(v, w);
  }
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : MaxSum<S>{S(-INFINITY), S(0)};
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<S> w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = max_sum_merge(v, w);
  }
  return v;
}

}  // namespace mg::cuda
