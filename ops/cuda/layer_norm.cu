// CUDA layer_norm over the last dim of contiguous (M, C) rows. Forward: one block per row, mean
// then centred squares (two-pass, as the CPU), y written in a third pass (the row stays in L1).
// Backward: dx with one block per row; dweight/dbias in the CPU's order: per block of 32 rows
// a partial sum per column (one thread per column walks the 32 rows), then the partials of the
// blocks added in order per column, so the result does not depend on launch sizes.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/row_reduce.cuh"

namespace mg::cuda {
namespace {

constexpr int64_t kRowsPerBlock = 32;  // as ops/layer_norm.cpp

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__global__ void layer_norm_forward_kernel(T* y, stat_t<T>* mean, stat_t<T>* rstd, const T* x, const T* w,
                                          int64_t ws, const T* b, int64_t bs, int64_t C, double eps) {
  using S = stat_t<T>;
  __shared__ S shared[32];
  const T* xi = x + blockIdx.x * C;
  T* yi = y + blockIdx.x * C;
  S m = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m += S(xi[j]);
  m = block_sum(m, shared) / S(C);
  S v = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const S d = S(xi[j]) - m;
    v += d * d;
  }
  v = block_sum(v, shared);
  const S r = S(1) / ::sqrt(v / S(C) + S(eps));
  if (threadIdx.x == 0) mean[blockIdx.x] = m, rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    S h = (S(xi[j]) - m) * r;
    if (w) h *= S(w[j * ws]);
    if (b) h += S(b[j * bs]);
    yi[j] = T(h);
  }
}

// dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = dy * weight.
template <class T>
__global__ void layer_norm_dx_kernel(T* dx, const T* dy, const T* x, const stat_t<T>* mean, const stat_t<T>* rstd,
                                     const T* w, int64_t wst, int64_t C) {
  using S = stat_t<T>;
  __shared__ S shared[32];
  const int64_t i = blockIdx.x;
  const T *g = dy + i * C, *xi = x + i * C;
  const S m = mean[i], r = rstd[i];
  S a = 0, c = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const S gh = w ? S(g[j]) * S(w[j * wst]) : S(g[j]);
    a += gh;
    c += gh * (S(xi[j]) - m) * r;
  }
  a = block_sum(a, shared) / S(C);
  c = block_sum(c, shared) / S(C);
  T* o = dx + i * C;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const S gh = w ? S(g[j]) * S(w[j * wst]) : S(g[j]);
    o[j] = T(r * (gh - a - (S(xi[j]) - m) * r * c));
  }
}

// partial (blocks, 2, C): for row block blockIdx.y, sum of dy * xhat and sum of dy per column.
template <class T>
__global__ void layer_norm_param_partial_kernel(stat_t<T>* partial, const T* dy, const T* x, const stat_t<T>* mean,
                                                const stat_t<T>* rstd, int64_t M, int64_t C) {
  using S = stat_t<T>;
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= C) return;
  const int64_t blk = blockIdx.y;
  S sw = 0, sb = 0;
  for (int64_t i = blk * kRowsPerBlock, ie = min(M, (blk + 1) * kRowsPerBlock); i < ie; ++i) {
    const S g = S(dy[i * C + j]);
    sw += g * (S(x[i * C + j]) - mean[i]) * rstd[i];
    sb += g;
  }
  partial[blk * 2 * C + j] = sw;
  partial[blk * 2 * C + C + j] = sb;
}

template <class T>
__global__ void layer_norm_param_sum_kernel(T* dw, T* db, const stat_t<T>* partial, int64_t blocks, int64_t C) {
  using S = stat_t<T>;
  MG_GRID_STRIDE(j, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, C) {
    S sw = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) sw += partial[blk * 2 * C + j], sb += partial[blk * 2 * C + C + j];
    if (dw) dw[j] = T(sw);
    if (db) db[j] = T(sb);
  }
}

template <class T>
const T* opt_ptr(const Tensor& t) {
  return t.defined() ? elem_ptr<const T>(t) : nullptr;
}

}  // namespace

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                        const Tensor& b, double eps) {
  const int64_t C = x.size(-1), M = x.numel() / C;
  if (M == 0) return;
  MG_CHECK(x.is_contiguous() && y.is_contiguous() && M < (int64_t(1) << 31),
           "layer_norm: internal: bad CUDA operands");
  const int dev = x.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    using T = scalar_t;
    layer_norm_forward_kernel<T><<<unsigned(M), row_threads(C), 0, stream(dev)>>>(
        elem_ptr<T>(y), elem_ptr<stat_t<T>>(mean), elem_ptr<stat_t<T>>(rstd), elem_ptr<const T>(x), opt_ptr<T>(w),
        w.defined() ? w.stride(0) : 0, opt_ptr<T>(b), b.defined() ? b.stride(0) : 0, C, eps);
    MG_CUDA_CHECK_LAUNCH("layer_norm_forward_kernel");
  });
}

void layer_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                         const Tensor& mean, const Tensor& rstd, const Tensor& w) {
  const int64_t C = x.size(-1), M = x.numel() / C;
  if (M == 0) return;
  MG_CHECK(x.is_contiguous() && dy.is_contiguous() && M < (int64_t(1) << 31),
           "layer_norm backward: internal: bad CUDA operands");
  const int dev = x.device().index;
  DeviceGuard g(dev);
  const int64_t blocks = (M + kRowsPerBlock - 1) / kRowsPerBlock;
  MG_DISPATCH_FLOAT(x.dtype(), "layer_norm backward", [&] {
    using T = scalar_t;
    using S = stat_t<T>;
    if (dx.defined()) {
      layer_norm_dx_kernel<T><<<unsigned(M), row_threads(C), 0, stream(dev)>>>(
          elem_ptr<T>(dx), elem_ptr<const T>(dy), elem_ptr<const T>(x), elem_ptr<const S>(mean),
          elem_ptr<const S>(rstd), opt_ptr<T>(w), w.defined() ? w.stride(0) : 0, C);
      MG_CUDA_CHECK_LAUNCH("layer_norm_dx_kernel");
    }
    if (!dw.defined() && !db.defined()) return;
    MG_CHECK(blocks < 65536, "layer_norm backward: ", M, " rows are too many for one CUDA launch");
    Tensor partial;
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);
      partial = empty({blocks, 2, C}, {.dtype = dtype_of_v<S>, .device = x.device()});  // (blocks, 2, C)
    }
    const int threads = 128;
    dim3 grid(unsigned((C + threads - 1) / threads), unsigned(blocks));
    layer_norm_param_partial_kernel<T><<<grid, threads, 0, stream(dev)>>>(
        partial.data<S>(), elem_ptr<const T>(dy), elem_ptr<const T>(x), elem_ptr<const S>(mean),
        elem_ptr<const S>(rstd), M, C);
    MG_CUDA_CHECK_LAUNCH("layer_norm_param_partial_kernel");
    layer_norm_param_sum_kernel<T><<<grid_for(dev, C, kThreads), kThreads, 0, stream(dev)>>>(
        dw.defined() ? elem_ptr<T>(dw) : nullptr, db.defined() ? elem_ptr<T>(db) : nullptr, partial.data<S>(), blocks,
        C);
    MG_CUDA_CHECK_LAUNCH("layer_norm_param_sum_kernel");
  });
}

}  // namespace mg::cuda
