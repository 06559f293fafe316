// CUDA reductions: sum over any set of dims, amax/argmax over one dim, and the mse_loss sum.
// Determinism: every output is reduced by a fixed set of threads in a fixed tree (warp shuffles,
// then one value per warp in shared memory); when one output is split over several blocks, the
// split depends only on the shape, each block writes its partial to a workspace tensor, and a
// second kernel adds the partials in order. So a result has the same bits on every run.
//
// Two layouts for sum: "rows" (the reduced elements of an output are contiguous, or there are
// few outputs): one block per output (or per slice of it), threads striding over the reduced
// index; "columns" (reducing leading dims, e.g. a bias gradient (R, K) -> (K)): one thread per
// output walking the reduced index, neighbouring threads reading neighbouring addresses.
#include <cmath>

#include "core/cuda/kernel_utils.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class T>
__device__ __forceinline__ acc_t<T> load_acc(const T* p) {
  return acc_t<T>(compute_t<T>(*p));
}

template <class T, class A>
__device__ __forceinline__ T store_from_acc(A v) {
  return static_cast<T>(static_cast<compute_t<T>>(v));
}

// Block b reduces slice b % S of output b / S.
template <class T, class A>
__global__ void sum_rows_kernel(T* out, A* partial, const T* x, Indexer<1> kept, Indexer<1> red, int64_t R,
                                int64_t chunk, int S) {
  __shared__ A shared[32];
  const int64_t o = blockIdx.x / S;
  const int s = int(blockIdx.x % S);
  int64_t base[1];
  kept.offsets(o, base);
  const int64_t start = int64_t(s) * chunk, end = start + chunk < R ? start + chunk : R;
  A acc = A(0);
  for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x) {
    int64_t off[1];
    red.offsets(j, off);
    acc += load_acc(x + base[0] + off[0]);
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    if (S == 1) out[o] = store_from_acc<T>(acc);
    else partial[o * S + s] = acc;
  }
}

// Thread o of slice blockIdx.y reduces that slice of output o.
template <class T, class A>
__global__ void sum_cols_kernel(T* out, A* partial, const T* x, Indexer<1> kept, Indexer<1> red, int64_t n_out,
                                int64_t R, int64_t chunk) {
  const int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (o >= n_out) return;
  const int S = int(gridDim.y), s = int(blockIdx.y);
  int64_t base[1];
  kept.offsets(o, base);
  const int64_t start = int64_t(s) * chunk, end = start + chunk < R ? start + chunk : R;
  A acc = A(0);
  for (int64_t j = start; j < end; ++j) {
    int64_t off[1];
    red.offsets(j, off);
    acc += load_acc(x + base[0] + off[0]);
  }
  if (S == 1) out[o] = store_from_acc<T>(acc);
  else partial[int64_t(s) * n_out + o] = acc;
}

// out[o] = sum over s of partial (in slice order): [o * S + s] (rows) or [s * n_out + o] (cols).
template <class T, class A>
__global__ void sum_partials_kernel(T* out, const A* partial, int64_t n_out, int S, bool slice_major) {
  MG_GRID_STRIDE(o, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n_out) {
    A acc = A(0);
    for (int s = 0; s < S; ++s) acc += slice_major ? partial[int64_t(s) * n_out + o] : partial[o * S + s];
    out[o] = store_from_acc<T>(acc);
  }
}

DType acc_dtype(DType t) {
  if (t == DType::f64) return DType::f64;
  if (is_integral(t)) return DType::i64;
  return DType::f32;
}

template <class T>
void sum_impl(const Tensor& out, const Tensor& x, const std::vector<bool>& mask) {
  using A = acc_t<T>;
  Shape kept_sizes, kept_strides, red_sizes, red_strides;
  for (size_t d = 0; d < mask.size(); ++d) {
    (mask[d] ? red_sizes : kept_sizes).push_back(x.shape()[d]);
    (mask[d] ? red_strides : kept_strides).push_back(x.strides()[d]);
  }
  const int64_t n_out = numel_of(kept_sizes), R = numel_of(red_sizes);
  if (n_out == 0) return;
  if (R == 0) return fill(out, 0.0);
  const int dev = out.device().index;
  DeviceGuard g(dev);
  Indexer<1> kept = make_indexer<1>(kept_sizes, {kept_strides.data()}, "sum");
  Indexer<1> red = make_indexer<1>(red_sizes, {red_strides.data()}, "sum");
  const bool inner_contiguous = red.nd == 0 || red.strides[0][red.nd - 1] == 1;
  const bool rows = R > 32 && (inner_contiguous || n_out < 1024);
  const T* px = elem_ptr<const T>(x);
  T* po = elem_ptr<T>(out);
  // Slices per output: a function of the shape only (so the bits are too).
  const int64_t S = rows ? (n_out >= 1024 ? 1 : std::min<int64_t>((R + 16383) / 16384, 1024))
                         : std::min<int64_t>({(R + 511) / 512, std::max<int64_t>(1, 8192 / n_out), 65535});
  const int64_t chunk = (R + S - 1) / S;
  Tensor partial;
  if (S > 1) {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    partial = empty({n_out * S}, {.dtype = acc_dtype(x.dtype()), .device = out.device()});  // (n_out, S) or (S, n_out)
  }
  A* pp = S > 1 ? static_cast<A*>(partial.data_ptr()) : nullptr;
  if (rows) {
    const int threads = R >= 2048 ? 256 : R >= 512 ? 128 : 64;
    MG_CHECK(n_out * S < (int64_t(1) << 31), "sum: too many outputs for one CUDA launch: ", n_out);
    sum_rows_kernel<T, A><<<unsigned(n_out * S), threads, 0, stream(dev)>>>(po, pp, px, kept, red, R, chunk, int(S));
    MG_CUDA_CHECK_LAUNCH("sum_rows_kernel");
  } else {
    const int threads = 128;
    dim3 grid(unsigned((n_out + threads - 1) / threads), unsigned(S));
    MG_CHECK(grid.x < (1u << 31), "sum: too many outputs for one CUDA launch: ", n_out);
    sum_cols_kernel<T, A><<<grid, threads, 0, stream(dev)>>>(po, pp, px, kept, red, n_out, R, chunk);
    MG_CUDA_CHECK_LAUNCH("sum_cols_kernel");
  }
  if (S > 1) {
    sum_partials_kernel<T, A><<<grid_for(dev, n_out, kThreads), kThreads, 0, stream(dev)>>>(po, pp, n_out, int(S), !rows);
    MG_CUDA_CHECK_LAUNCH("sum_partials_kernel");
  }
}

// ---- amax / argmax: one warp per output ---------------------------------------------------------

// Should (cv, ci) replace (bv, bi)? NaN wins, then the larger value, then the smaller index;
// an index < 0 is "nothing yet". Associative and commutative: any tree gives the CPU's answer.
template <class C>
__device__ __forceinline__ bool better(C cv, int64_t ci, C bv, int64_t bi) {
  if (ci < 0) return false;
  if (bi < 0) return true;
  const bool cn = cv != cv, bn = bv != bv;
  if (cn || bn) return cn && (!bn || ci < bi);
  if (cv != bv) return cv > bv;
  return ci < bi;
}

template <class T>
__global__ void amax_kernel(T* values, int64_t* indices, const T* x, Indexer<1> outer, int64_t m, int64_t n,
                            int64_t st) {
  using C = compute_t<T>;
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= m) return;  // whole warps leave together (m is counted in warps)
  int64_t base[1];
  outer.offsets(w, base);
  C best = C(0);
  int64_t bi = -1;
  for (int64_t k = lane; k < n; k += 32) {
    C c = C(x[base[0] + k * st]);
    if (better(c, k, best, bi)) best = c, bi = k;
  }
  for (int o = 16; o > 0; o >>= 1) {
    C ov = __shfl_xor_sync(0xffffffffu, best, o);
    int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, best, bi)) best = ov, bi = oi;
  }
  if (lane == 0) {
    if (values) values[w] = T(best);
    if (indices) indices[w] = bi;
  }
}

// ---- mse_loss: fixed chunks, partials in f64, added by one block in a fixed tree -----------------

template <class T>
__global__ void sq_diff_partial_kernel(double* partial, const T* a, const T* b, int64_t n, int64_t chunk) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const int64_t start = blockIdx.x * chunk, end = start + chunk < n ? start + chunk : n;
  A acc = A(0);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    A d = A(compute_t<T>(a[i])) - A(compute_t<T>(b[i]));
    acc += d * d;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = double(acc);
}

template <class T>
__global__ void mean_of_partials_kernel(T* loss, const double* partial, int G, double n) {
  __shared__ double shared[32];
  double acc = 0;
  for (int i = threadIdx.x; i < G; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *loss = T(compute_t<T>(acc / n));
}

}  // namespace

void sum(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  MG_CHECK(out.is_contiguous() && reduced.size() == size_t(x.dim()), "sum: internal: bad CUDA operands");
  MG_DISPATCH_NUMERIC(x.dtype(), "sum", [&] { sum_impl<scalar_t>(out, x, reduced); });
}

void amax(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim) {
  Shape outer = x.shape(), outer_st = x.strides();
  const int64_t n = x.shape()[size_t(dim)], st = x.strides()[size_t(dim)];
  outer.erase(outer.begin() + dim);
  outer_st.erase(outer_st.begin() + dim);
  const int64_t m = numel_of(outer);
  if (m == 0) return;
  const int dev = x.device().index;
  DeviceGuard g(dev);
  Indexer<1> ix = make_indexer<1>(outer, {outer_st.data()}, "amax");
  const int threads = 256;  // 8 outputs per block
  const int64_t blocks = (m * 32 + threads - 1) / threads;
  MG_CHECK(blocks < (int64_t(1) << 31), "amax: too many outputs for one CUDA launch: ", m);
  MG_DISPATCH_NUMERIC(x.dtype(), "amax", [&] {
    amax_kernel<scalar_t><<<unsigned(blocks), threads, 0, stream(dev)>>>(
        values.defined() ? elem_ptr<scalar_t>(values) : nullptr,
        indices.defined() ? elem_ptr<int64_t>(indices) : nullptr, elem_ptr<const scalar_t>(x), ix, m, n, st);
    MG_CUDA_CHECK_LAUNCH("amax_kernel");
  });
}

void mse_loss(const Tensor& loss, const Tensor& a, const Tensor& b) {
  const int64_t n = a.numel();
  if (n == 0) return fill(loss, std::nan(""));
  MG_CHECK(a.is_contiguous() && b.is_contiguous(), "mse_loss: internal: CUDA operands must be contiguous");
  const int dev = a.device().index;
  DeviceGuard g(dev);
  const int64_t G = std::min<int64_t>((n + 4095) / 4096, 1024), chunk = (n + G - 1) / G;
  Tensor partial;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    partial = empty({G}, {.dtype = DType::f64, .device = a.device()});  // (G)
  }
  MG_DISPATCH_FLOAT(a.dtype(), "mse_loss", [&] {
    sq_diff_partial_kernel<scalar_t><<<unsigned(G), 256, 0, stream(dev)>>>(
        partial.data<double>(), elem_ptr<const scalar_t>(a), elem_ptr<const scalar_t>(b), n, chunk);
    MG_CUDA_CHECK_LAUNCH("sq_diff_partial_kernel");
    mean_of_partials_kernel<scalar_t><<<1, 256, 0, stream(dev)>>>(elem_ptr<scalar_t>(loss), partial.data<double>(),
                                                                  int(G), double(n));
    MG_CUDA_CHECK_LAUNCH("mean_of_partials_kernel");
  });
}

}  // namespace mg::cuda
