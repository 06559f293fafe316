// CUDA softmax / log_softmax forward and backward over (outer, n, inner). inner == 1 (the
// softmax dim is the last one, contiguous): one block per row; the max and the sum of exp come
// from one online pass (row_reduce.cuh), then y is written in a second pass. inner > 1: one
// thread per (outer, inner) column, walking the row with stride inner (neighbouring threads read
// neighbouring addresses). Statistics in f32 (f64 for f64), as the CPU kernels.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/row_reduce.cuh"

namespace mg::cuda {
namespace {

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__global__ void softmax_rows_kernel(T* y, const T* x, int64_t n, bool log) {
  using S = stat_t<T>;
  __shared__ MaxSum<S> shared[32];
  const T* xi = x + blockIdx.x * n;
  T* yi = y + blockIdx.x * n;
  MaxSum<S> st{S(-INFINITY), S(0)};
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) st = max_sum_add(st, S(xi[k]));
  st = block_max_sum(st, shared);
  if (log) {
    const S lse = st.m + ::log(st.s);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) yi[k] = T(S(xi[k]) - lse);
  } else {
    const S inv = S(1) / st.s;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) yi[k] = T(::exp(S(xi[k]) - st.m) * inv);
  }
}

template <class T>
__global__ void softmax_cols_kernel(T* y, const T* x, int64_t outer, int64_t n, int64_t inner, bool log) {
  using S = stat_t<T>;
  MG_GRID_STRIDE(r, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, outer * inner) {
    const int64_t base = (r / inner) * n * inner + r % inner;
    const T* xi = x + base;
    T* yi = y + base;
    MaxSum<S> st{S(-INFINITY), S(0)};
    for (int64_t k = 0; k < n; ++k) st = max_sum_add(st, S(xi[k * inner]));
    const S lse = st.m + ::log(st.s), inv = S(1) / st.s;
    for (int64_t k = 0; k < n; ++k)
      yi[k * inner] = log ? T(S(xi[k * inner]) - lse) : T(::exp(S(xi[k * inner]) - st.m) * inv);
  }
}

// softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
template <class T>
__global__ void softmax_backward_rows_kernel(T* dx, const T* dy, const T* y, int64_t n, bool log) {
  using S = stat_t<T>;
  __shared__ S shared[32];
  const int64_t base = blockIdx.x * n;
  S s = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += log ? S(dy[base + k]) : S(dy[base + k]) * S(y[base + k]);
  s = block_sum(s, shared);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const S g = S(dy[base + k]), yv = S(y[base + k]);
    dx[base + k] = log ? T(g - ::exp(yv) * s) : T(yv * (g - s));
  }
}

template <class T>
__global__ void softmax_backward_cols_kernel(T* dx, const T* dy, const T* y, int64_t outer, int64_t n, int64_t inner,
                                             bool log) {
  using S = stat_t<T>;
  MG_GRID_STRIDE(r, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, outer * inner) {
    const int64_t base = (r / inner) * n * inner + r % inner;
    S s = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = base + k * inner;
      s += log ? S(dy[i]) : S(dy[i]) * S(y[i]);
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = base + k * inner;
      const S g = S(dy[i]), yv = S(y[i]);
      dx[i] = log ? T(g - ::exp(yv) * s) : T(yv * (g - s));
    }
  }
}

void check_rows(const char* op, int64_t outer, int64_t inner) {
  MG_CHECK(outer * inner < (int64_t(1) << 31), op, ": ", outer * inner, " rows are too many for one CUDA launch");
}

}  // namespace

void softmax_forward(const Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  if (outer * n * inner == 0) return;
  MG_CHECK(x.is_contiguous() && y.is_contiguous(), op, ": internal: CUDA operands must be contiguous");
  check_rows(op, outer, inner);
  const int dev = y.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const scalar_t* px = elem_ptr<const scalar_t>(x);
    scalar_t* py = elem_ptr<scalar_t>(y);
    if (inner == 1) {
      softmax_rows_kernel<scalar_t><<<unsigned(outer), row_threads(n), 0, stream(dev)>>>(py, px, n, log);
      MG_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
    } else {
      softmax_cols_kernel<scalar_t><<<grid_for(dev, outer * inner, 128), 128, 0, stream(dev)>>>(py, px, outer, n, inner,
                                                                                              log);
      MG_CUDA_CHECK_LAUNCH("softmax_cols_kernel");
    }
  });
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t outer, int64_t n, int64_t inner,
                      bool log) {
  const char* op = log ? "LogSoftmaxBackward" : "SoftmaxBackward";
  if (outer * n * inner == 0) return;
  MG_CHECK(dx.is_contiguous() && dy.is_contiguous() && y.is_contiguous(), op,
           ": internal: CUDA operands must be contiguous");
  check_rows(op, outer, inner);
  const int dev = y.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(y.dtype(), op, [&] {
    const scalar_t* pdy = elem_ptr<const scalar_t>(dy);
    const scalar_t* py = elem_ptr<const scalar_t>(y);
    scalar_t* pdx = elem_ptr<scalar_t>(dx);
    if (inner == 1) {
      softmax_backward_rows_kernel<scalar_t><<<unsigned(outer), row_threads(n), 0, stream(dev)>>>(pdx, pdy, py, n, log);
      MG_CUDA_CHECK_LAUNCH("softmax_backward_rows_kernel");
    } else {
      softmax_backward_cols_kernel<scalar_t><<<grid_for(dev, outer * inner, 128), 128, 0, stream(dev)>>>(
          pdx, pdy, py, outer, n, inner, log);
      MG_CUDA_CHECK_LAUNCH("softmax_backward_cols_kernel");
    }
  });
}

}  // namespace mg::cuda
