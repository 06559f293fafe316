// CUDA batch_norm over x viewed as (N, C, S): one block per channel sums its N * S values in f64
// (mean, then centred squares, as the CPU) in a fixed tree; a per-channel kernel turns them into
// mean/rstd and moves the running buffers; normalisation is element-wise; backward is one block
// per channel (sum dy and dy * xhat in f64, then dx in a second pass over the channel). The affine
// parameters have x's dtype or, for a 16-bit x, f32 (mixed precision).
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/row_reduce.cuh"

namespace mg::cuda {
namespace {

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Element t of channel c: (n, s) = (t / S, t % S).
__device__ __forceinline__ int64_t channel_offset(int64_t t, int64_t c, int64_t C, int64_t S) {
  const int64_t n = t / S;
  return (n * C + c) * S + (t - n * S);
}

template <class T>
__global__ void bn_stats_kernel(double* stats, const T* x, int64_t N, int64_t C, int64_t S) {
  __shared__ double shared[32];
  const int64_t c = blockIdx.x, count = N * S;
  double s = 0;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) s += double(compute_t<T>(x[channel_offset(t, c, C, S)]));
  const double m = block_sum(s, shared) / double(count);
  double q = 0;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
    const double d = double(compute_t<T>(x[channel_offset(t, c, C, S)])) - m;
    q += d * d;
  }
  q = block_sum(q, shared);
  if (threadIdx.x == 0) stats[c] = m, stats[C + c] = q / double(count);
}

template <class S, class R>
__global__ void bn_finish_kernel(S* mean, S* rstd, const double* stats, int64_t C, double eps, R* rm, int64_t rms,
                                 R* rv, int64_t rvs, double momentum, double unbias) {
  using CR = compute_t<R>;
  MG_GRID_STRIDE(c, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, C) {
    const double bm = stats[c], bv = stats[C + c];
    mean[c] = S(bm);
    rstd[c] = S(1.0 / ::sqrt(bv + eps));
    if (rm) {
      rm[c * rms] = R(CR((1.0 - momentum) * double(CR(rm[c * rms])) + momentum * bm));
      rv[c * rvs] = R(CR((1.0 - momentum) * double(CR(rv[c * rvs])) + momentum * bv * unbias));
    }
  }
}

// T: x and y; P: w and b (T, or f32 for a 16-bit T).
template <class T, class P>
__global__ void bn_normalize_kernel(T* y, const T* x, const stat_t<T>* mean, const stat_t<T>* rstd, const P* w,
                                    int64_t ws, const P* b, int64_t bs, int64_t C, int64_t S, int64_t n) {
  using ST = stat_t<T>;
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    const int64_t c = (e / S) % C;
    const ST scale = rstd[c] * (w ? ST(compute_t<P>(w[c * ws])) : ST(1));  // y = x * scale + shift
    const ST shift = (b ? ST(compute_t<P>(b[c * bs])) : ST(0)) - mean[c] * scale;
    y[e] = T(ST(x[e]) * scale + shift);
  }
}

// T: dy, x and dx; P: w, dw and db.
template <class T, class P>
__global__ void bn_backward_kernel(T* dx, P* dw, P* db, const T* dy, const T* x, const stat_t<T>* mean,
                                   const stat_t<T>* rstd, const P* w, int64_t wst, int64_t N, int64_t C, int64_t S,
                                   bool training) {
  using ST = stat_t<T>;
  __shared__ double shared[32];
  const int64_t c = blockIdx.x, count = N * S;
  const double m = double(mean[c]), r = double(rstd[c]);
  double sdy = 0, sdyh = 0;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
    const int64_t o = channel_offset(t, c, C, S);
    const double gv = double(compute_t<T>(dy[o]));
    sdy += gv;
    sdyh += gv * (double(compute_t<T>(x[o])) - m) * r;
  }
  sdy = block_sum(sdy, shared);
  sdyh = block_sum(sdyh, shared);
  if (threadIdx.x == 0) {
    if (dw) dw[c] = P(ST(sdyh));
    if (db) db[c] = P(ST(sdy));
  }
  if (!dx) return;
  // training: dx = w * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)); eval: dx = w * rstd * dy
  const ST k = ST(r * (w ? double(compute_t<P>(w[c * wst])) : 1.0));
  const ST a = training ? ST(sdy / double(count)) : ST(0);
  const ST bh = training ? ST(sdyh / double(count)) : ST(0);
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
    const int64_t o = channel_offset(t, c, C, S);
    dx[o] = T(k * (ST(dy[o]) - a - (ST(x[o]) - ST(m)) * ST(r) * bh));
  }
}

template <class T>
const T* opt_ptr(const Tensor& t) {
  return t.defined() ? elem_ptr<const T>(t) : nullptr;
}

// Calls f with a null P* for the affine parameters' dtype pd: T's own, or f32 (mixed).
template <class T, class F>
void dispatch_param(DType pd, F f) {
  if (pd == dtype_of_v<T>) f(static_cast<T*>(nullptr));
  else f(static_cast<float*>(nullptr));
}

int channel_threads(int64_t count) { return count >= 4096 ? 512 : count >= 1024 ? 256 : count > 64 ? 128 : 32; }

}  // namespace

void batch_norm_stats(const Tensor& stats, const Tensor& x, int64_t N, int64_t C, int64_t S) {
  if (C == 0) return;
  MG_CHECK(x.is_contiguous() && stats.is_contiguous() && stats.dtype() == DType::f64,
           "batch_norm: internal: bad CUDA operands");
  const int dev = x.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    bn_stats_kernel<scalar_t><<<unsigned(C), channel_threads(N * S), 0, stream(dev)>>>(
        stats.data<double>(), elem_ptr<const scalar_t>(x), N, C, S);
    MG_CUDA_CHECK_LAUNCH("bn_stats_kernel");
  });
}

void batch_norm_finish_stats(const Tensor& mean, const Tensor& rstd, const Tensor& stats, double eps,
                             const Tensor& running_mean, const Tensor& running_var, double momentum, double unbias) {
  const int64_t C = mean.numel();
  if (C == 0) return;
  const int dev = mean.device().index;
  DeviceGuard g(dev);
  MG_CHECK(!running_mean.defined() || running_mean.dtype() == running_var.dtype(),
           "batch_norm: running_mean and running_var must have one dtype on CUDA, got ", running_mean.dtype(), " and ",
           running_var.dtype());
  const DType rd = running_mean.defined() ? running_mean.dtype() : DType::f32;
  auto launch = [&](auto* pm, auto* pr) {
    using S = std::remove_pointer_t<decltype(pm)>;
    MG_DISPATCH_FLOAT(rd, "batch_norm", [&] {
      using R = scalar_t;
      const bool run = running_mean.defined();
      bn_finish_kernel<S, R><<<grid_for(dev, C, 128), 128, 0, stream(dev)>>>(
          pm, pr, stats.data<double>(), C, eps, run ? elem_ptr<R>(running_mean) : nullptr,
          run ? running_mean.stride(0) : 0, run ? elem_ptr<R>(running_var) : nullptr, run ? running_var.stride(0) : 0,
          momentum, unbias);
      MG_CUDA_CHECK_LAUNCH("bn_finish_kernel");
    });
  };
  if (mean.dtype() == DType::f64) launch(mean.data<double>(), rstd.data<double>());
  else launch(mean.data<float>(), rstd.data<float>());
}

void batch_norm_normalize(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                          const Tensor& b, int64_t N, int64_t C, int64_t S) {
  const int64_t n = N * C * S;
  if (n == 0) return;
  MG_CHECK(x.is_contiguous() && y.is_contiguous(), "batch_norm: internal: bad CUDA operands");
  const int dev = x.device().index;
  DeviceGuard g(dev);
  const DType pd = w.defined() ? w.dtype() : b.defined() ? b.dtype() : x.dtype();
  MG_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    dispatch_param<T>(pd, [&](auto* p) {
      using P = std::remove_pointer_t<decltype(p)>;
      bn_normalize_kernel<T, P><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
          elem_ptr<T>(y), elem_ptr<const T>(x), elem_ptr<const stat_t<T>>(mean), elem_ptr<const stat_t<T>>(rstd),
          opt_ptr<P>(w), w.defined() ? w.stride(0) : 0, opt_ptr<P>(b), b.defined() ? b.stride(0) : 0, C, S, n);
      MG_CUDA_CHECK_LAUNCH("bn_normalize_kernel");
    });
  });
}

void batch_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                         const Tensor& mean, const Tensor& rstd, const Tensor& w, int64_t N, int64_t C, int64_t S,
                         bool training) {
  if (C == 0) return;
  MG_CHECK(x.is_contiguous() && dy.is_contiguous() && (!dx.defined() || dx.is_contiguous()),
           "batch_norm backward: internal: bad CUDA operands");
  const int dev = x.device().index;
  DeviceGuard g(dev);
  const DType pd = w.defined() ? w.dtype() : dw.defined() ? dw.dtype() : db.defined() ? db.dtype() : x.dtype();
  MG_DISPATCH_FLOAT(x.dtype(), "batch_norm backward", [&] {
    using T = scalar_t;
    dispatch_param<T>(pd, [&](auto* p) {
      using P = std::remove_pointer_t<decltype(p)>;
      bn_backward_kernel<T, P><<<unsigned(C), channel_threads(N * S), 0, stream(dev)>>>(
          dx.defined() ? elem_ptr<T>(dx) : nullptr, dw.defined() ? elem_ptr<P>(dw) : nullptr,
          db.defined() ? elem_ptr<P>(db) : nullptr, elem_ptr<const T>(dy), elem_ptr<const T>(x),
          elem_ptr<const stat_t<T>>(mean), elem_ptr<const stat_t<T>>(rstd), opt_ptr<P>(w),
          w.defined() ? w.stride(0) : 0, N, C, S, training);
      MG_CUDA_CHECK_LAUNCH("bn_backward_kernel");
    });
  });
}

}  // namespace mg::cuda
