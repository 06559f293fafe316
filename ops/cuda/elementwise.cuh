// The one templated element-wise kernel pair behind every CUDA element-wise op: a contiguous
// path that moves 16 bytes per load/store (when every pointer is 16-byte aligned) and a
// broadcasting path that finds each input's element through its strides (0 on broadcast dims).
// Both are grid-stride loops; values are loaded in their compute type (float for f16/bf16) and
// handed to a functor of ops/kernels/elementwise_functors.h, the same code the CPU runs.
#pragma once
#include <cstdint>

#include "core/cuda/kernel_utils.cuh"
#include "core/tensor.h"
#include "ops/kernels/elementwise_functors.h"

namespace mg::cuda {

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements per 16-byte access for an output O and inputs A.
template <class O, class A>
constexpr int vec_width() {
  constexpr size_t w = sizeof(O) > sizeof(A) ? sizeof(O) : sizeof(A);
  return int(16 / w) > 0 ? int(16 / w) : 1;
}

template <class T>
T* elem_ptr(const Tensor& t) {
  return static_cast<T*>(t.storage()->data()) + t.storage_offset();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Strides that walk t as if broadcast to `shape` (0 along broadcast dims), as the CPU's.
inline Shape bcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  size_t off = shape.size() - size_t(t.dim());
  for (size_t i = 0; i < size_t(t.dim()); ++i) st[off + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

#define MG_GRID_STRIDE(i, start, n) \
  for (int64_t i = (start); i < (n); i += int64_t(gridDim.x) * blockDim.x)

// ---- out = f(a) -------------------------------------------------------------------------------

template <int V, class O, class A, class F>
__global__ void map1_contig(O* o, const A* a, int64_t n, F f, bool vec) {
  using CA = compute_t<A>;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t nvec = vec ? n / V : 0;
  MG_GRID_STRIDE(i, tid, nvec) {
    Pack<A, V> in = reinterpret_cast<const Pack<A, V>*>(a)[i];
    Pack<O, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = static_cast<O>(f(static_cast<CA>(in.v[k])));
    reinterpret_cast<Pack<O, V>*>(o)[i] = r;
  }
  MG_GRID_STRIDE(i, nvec * V + tid, n) o[i] = static_cast<O>(f(static_cast<CA>(a[i])));
}

template <class O, class A, class F>
__global__ void map1_strided(O* o, const A* a, int64_t n, Indexer<1> ix, F f) {
  using CA = compute_t<A>;
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    int64_t off[1];
    ix.offsets(i, off);
    o[i] = static_cast<O>(f(static_cast<CA>(a[off[0]])));
  }
}

// ---- out = f(a, b) ----------------------------------------------------------------------------

template <int V, class O, class A, class F>
__global__ void map2_contig(O* o, const A* a, const A* b, int64_t n, F f, bool vec) {
  using CA = compute_t<A>;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t nvec = vec ? n / V : 0;
  MG_GRID_STRIDE(i, tid, nvec) {
    Pack<A, V> x = reinterpret_cast<const Pack<A, V>*>(a)[i];
    Pack<A, V> y = reinterpret_cast<const Pack<A, V>*>(b)[i];
    Pack<O, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = static_cast<O>(f(static_cast<CA>(x.v[k]), static_cast<CA>(y.v[k])));
    reinterpret_cast<Pack<O, V>*>(o)[i] = r;
  }
  MG_GRID_STRIDE(i, nvec * V + tid, n) o[i] = static_cast<O>(f(static_cast<CA>(a[i]), static_cast<CA>(b[i])));
}

template <class O, class A, class F>
__global__ void map2_strided(O* o, const A* a, const A* b, int64_t n, Indexer<2> ix, F f) {
  using CA = compute_t<A>;
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    int64_t off[2];
    ix.offsets(i, off);
    o[i] = static_cast<O>(f(static_cast<CA>(a[off[0]]), static_cast<CA>(b[off[1]])));
  }
}

// ---- host side ----------------------------------------------------------------------------------

template <class O, class A, class F>
void launch_map1(const char* op, const Tensor& out, const Tensor& a, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MG_CHECK(out.is_contiguous(), op, ": internal: CUDA element-wise output must be contiguous");
  const int dev = out.device().index;
  DeviceGuard g(dev);
  O* po = elem_ptr<O>(out);
  const A* pa = elem_ptr<const A>(a);
  if (a.is_contiguous() && a.shape() == out.shape()) {
    constexpr int V = vec_width<O, A>();
    const bool vec = aligned16(po) && aligned16(pa);
    map1_contig<V, O, A, F><<<grid_for(dev, vec ? (n + V - 1) / V : n, kThreads), kThreads, 0, stream(dev)>>>(
        po, pa, n, f, vec);
    MG_CUDA_CHECK_LAUNCH("map1_contig");
    return;
  }
  Shape sa = bcast_strides(a, out.shape());
  Indexer<1> ix = make_indexer<1>(out.shape(), {sa.data()}, op);
  map1_strided<O, A, F><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(po, pa, n, ix, f);
  MG_CUDA_CHECK_LAUNCH("map1_strided");
}

template <class O, class A, class F>
void launch_map2(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MG_CHECK(out.is_contiguous(), op, ": internal: CUDA element-wise output must be contiguous");
  const int dev = out.device().index;
  DeviceGuard g(dev);
  O* po = elem_ptr<O>(out);
  const A* pa = elem_ptr<const A>(a);
  const A* pb = elem_ptr<const A>(b);
  if (a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() && b.shape() == out.shape()) {
    constexpr int V = vec_width<O, A>();
    const bool vec = aligned16(po) && aligned16(pa) && aligned16(pb);
    map2_contig<V, O, A, F><<<grid_for(dev, vec ? (n + V - 1) / V : n, kThreads), kThreads, 0, stream(dev)>>>(
        po, pa, pb, n, f, vec);
    MG_CUDA_CHECK_LAUNCH("map2_contig");
    return;
  }
  Shape sa = bcast_strides(a, out.shape()), sb = bcast_strides(b, out.shape());
  Indexer<2> ix = make_indexer<2>(out.shape(), {sa.data(), sb.data()}, op);
  map2_strided<O, A, F><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(po, pa, pb, n, ix, f);
  MG_CUDA_CHECK_LAUNCH("map2_strided");
}

// f(x, s) with the scalar converted once to the compute type (as the CPU's scalar ops).
template <class F, class C>
struct BindScalar {
  F f;
  C s;
  template <class T>
  __device__ __forceinline__ auto operator()(T x) const { return f(x, s); }
};

// s - x and s / x: the scalar comes first.
struct RSub { template <class T> MG_HOST_DEVICE T operator()(T x, T s) const { return s - x; } };
struct RDiv { template <class T> MG_HOST_DEVICE T operator()(T x, T s) const { return s / x; } };

}  // namespace mg::cuda
