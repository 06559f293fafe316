// CUDA pooling, the CPU's loops (ops/pool.cpp) with one thread per output (forward) or per input
// element (backward): each backward thread gathers, in the CPU's window order, what the windows
// covering its element send it, so there are no atomics and the sums have fixed order.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class T>
__global__ void max_pool_forward_kernel(Pool2dGeom g, const T* x, T* out, int32_t* idx) {
  using A = compute_t<T>;
  MG_GRID_STRIDE(o, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, g.N * g.C * g.OH * g.OW) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, pl = o / (g.OH * g.OW);
    const T* xp = x + pl * g.H * g.W;
    const int64_t hs = oh * g.s - g.p, ws = ow * g.s - g.p;
    const int64_t h0 = hs > 0 ? hs : 0, w0 = ws > 0 ? ws : 0;
    const int64_t h1 = hs + g.k < g.H ? hs + g.k : g.H, w1 = ws + g.k < g.W ? ws + g.k : g.W;
    A best = A(-INFINITY);
    int64_t bi = h0 * g.W + w0;
    bool nan = false;
    for (int64_t ih = h0; ih < h1 && !nan; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) {
        const A v = A(xp[ih * g.W + iw]);
        if (v > best || v != v) {
          best = v, bi = ih * g.W + iw;
          if (v != v) {
            nan = true;
            break;
          }
        }
      }
    out[o] = T(best);
    if (idx) idx[o] = int32_t(bi);
  }
}

// The windows (oh, ow) that cover input (ih, iw): oh*s - p <= ih < oh*s - p + k.
struct Cover {
  int64_t oh0, oh1, ow0, ow1;  // inclusive ranges
};
__device__ __forceinline__ Cover cover(const Pool2dGeom& g, int64_t ih, int64_t iw) {
  const int64_t h0 = (ih + g.p - g.k + g.s) / g.s, w0 = (iw + g.p - g.k + g.s) / g.s;  // as the CPU
  const int64_t h1 = (ih + g.p) / g.s, w1 = (iw + g.p) / g.s;
  return {h0 > 0 ? h0 : 0, h1 < g.OH - 1 ? h1 : g.OH - 1, w0 > 0 ? w0 : 0, w1 < g.OW - 1 ? w1 : g.OW - 1};
}

template <class T>
__global__ void max_pool_backward_kernel(Pool2dGeom g, const T* dout, const int32_t* idx, T* dx) {
  using A = compute_t<T>;
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, g.N * g.C * g.H * g.W) {
    const int64_t iw = e % g.W, ih = (e / g.W) % g.H, pl = e / (g.H * g.W);
    const int32_t me = int32_t(ih * g.W + iw);
    const Cover c = cover(g, ih, iw);
    A acc = 0;
    for (int64_t oh = c.oh0; oh <= c.oh1; ++oh)
      for (int64_t ow = c.ow0; ow <= c.ow1; ++ow) {
        const int64_t o = (pl * g.OH + oh) * g.OW + ow;
        if (idx[o] == me) acc += A(dout[o]);
      }
    dx[e] = T(acc);
  }
}

template <class T>
__global__ void avg_pool_forward_kernel(Pool2dGeom g, const T* x, T* out) {
  using A = compute_t<T>;
  const A inv = A(1) / A(g.k * g.k);
  MG_GRID_STRIDE(o, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, g.N * g.C * g.OH * g.OW) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, pl = o / (g.OH * g.OW);
    const T* xp = x + pl * g.H * g.W;
    const int64_t hs = oh * g.s - g.p, ws = ow * g.s - g.p;
    const int64_t h0 = hs > 0 ? hs : 0, w0 = ws > 0 ? ws : 0;
    const int64_t h1 = hs + g.k < g.H ? hs + g.k : g.H, w1 = ws + g.k < g.W ? ws + g.k : g.W;
    A acc = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) acc += A(xp[ih * g.W + iw]);
    out[o] = T(acc * inv);
  }
}

template <class T>
__global__ void avg_pool_backward_kernel(Pool2dGeom g, const T* dout, T* dx) {
  using A = compute_t<T>;
  const A inv = A(1) / A(g.k * g.k);
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, g.N * g.C * g.H * g.W) {
    const int64_t iw = e % g.W, ih = (e / g.W) % g.H, pl = e / (g.H * g.W);
    const Cover c = cover(g, ih, iw);
    const T* gp = dout + pl * g.OH * g.OW;
    A acc = 0;
    for (int64_t oh = c.oh0; oh <= c.oh1; ++oh)
      for (int64_t ow = c.ow0; ow <= c.ow1; ++ow) acc += A(gp[oh * g.OW + ow]);
    dx[e] = T(acc * inv);
  }
}

// One thread per plane, in the CPU's order (planes are small: 7x7 to 32x32 in MobileNetV2).
template <class T>
__global__ void global_avg_forward_kernel(const T* x, T* out, int64_t planes, int64_t hw) {
  using A = compute_t<T>;
  MG_GRID_STRIDE(pl, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, planes) {
    A acc = 0;
    for (int64_t i = 0; i < hw; ++i) acc += A(x[pl * hw + i]);
    out[pl] = T(acc / A(hw));
  }
}

template <class T>
__global__ void global_avg_backward_kernel(const T* dout, T* dx, int64_t n, int64_t hw) {
  using A = compute_t<T>;
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) dx[e] = T(A(dout[e / hw]) / A(hw));
}

void check_dense(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) MG_CHECK(!t->defined() || t->is_contiguous(), op, ": internal: CUDA operands must be contiguous");
}

}  // namespace

void max_pool2d_forward(const Pool2dGeom& g, const Tensor& x, const Tensor& out, const Tensor& idx) {
  check_dense("max_pool2d", {&x, &out, &idx});
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  MG_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    max_pool_forward_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        g, elem_ptr<const scalar_t>(x), elem_ptr<scalar_t>(out), idx.defined() ? elem_ptr<int32_t>(idx) : nullptr);
    MG_CUDA_CHECK_LAUNCH("max_pool_forward_kernel");
  });
}

void max_pool2d_backward(const Pool2dGeom& g, const Tensor& dout, const Tensor& idx, const Tensor& dx) {
  check_dense("max_pool2d_backward", {&dout, &idx, &dx});
  const int64_t n = dx.numel();
  if (n == 0) return;
  const int dev = dx.device().index;
  DeviceGuard guard(dev);
  MG_DISPATCH_FLOAT(dx.dtype(), "max_pool2d_backward", [&] {
    max_pool_backward_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        g, elem_ptr<const scalar_t>(dout), elem_ptr<const int32_t>(idx), elem_ptr<scalar_t>(dx));
    MG_CUDA_CHECK_LAUNCH("max_pool_backward_kernel");
  });
}

void avg_pool2d_forward(const Pool2dGeom& g, const Tensor& x, const Tensor& out) {
  check_dense("avg_pool2d", {&x, &out});
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  MG_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", [&] {
    avg_pool_forward_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        g, elem_ptr<const scalar_t>(x), elem_ptr<scalar_t>(out));
    MG_CUDA_CHECK_LAUNCH("avg_pool_forward_kernel");
  });
}

void avg_pool2d_backward(const Pool2dGeom& g, const Tensor& dout, const Tensor& dx) {
  check_dense("avg_pool2d_backward", {&dout, &dx});
  const int64_t n = dx.numel();
  if (n == 0) return;
  const int dev = dx.device().index;
  DeviceGuard guard(dev);
  MG_DISPATCH_FLOAT(dx.dtype(), "avg_pool2d_backward", [&] {
    avg_pool_backward_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        g, elem_ptr<const scalar_t>(dout), elem_ptr<scalar_t>(dx));
    MG_CUDA_CHECK_LAUNCH("avg_pool_backward_kernel");
  });
}

void global_avg_pool2d_forward(const Tensor& x, const Tensor& out) {
  check_dense("global_avg_pool2d", {&x, &out});
  const int64_t planes = out.numel(), hw = x.size(2) * x.size(3);
  if (planes == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  MG_DISPATCH_FLOAT(x.dtype(), "global_avg_pool2d", [&] {
    global_avg_forward_kernel<scalar_t><<<grid_for(dev, planes, 128), 128, 0, stream(dev)>>>(
        elem_ptr<const scalar_t>(x), elem_ptr<scalar_t>(out), planes, hw);
    MG_CUDA_CHECK_LAUNCH("global_avg_forward_kernel");
  });
}

void global_avg_pool2d_backward(const Tensor& dout, const Tensor& dx) {
  check_dense("global_avg_pool2d_backward", {&dout, &dx});
  const int64_t n = dx.numel(), hw = dx.size(2) * dx.size(3);
  if (n == 0) return;
  const int dev = dx.device().index;
  DeviceGuard guard(dev);
  MG_DISPATCH_FLOAT(dx.dtype(), "global_avg_pool2d_backward", [&] {
    global_avg_backward_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        elem_ptr<const scalar_t>(dout), elem_ptr<scalar_t>(dx), n, hw);
    MG_CUDA_CHECK_LAUNCH("global_avg_backward_kernel");
  });
}

}  // namespace mg::cuda
