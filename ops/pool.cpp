// Pooling over (N, C, H, W): max_pool2d, avg_pool2d (padding counts as zeros, PyTorch's
// count_include_pad=True default, floor mode: the divisor is always kernel^2) and
// global_avg_pool2d ((N, C, H, W) -> (N, C)). Direct loops, one (n, c) plane per task, computed
// in f32 (f64 for f64) and rounded on store, so f16/bf16 need no workspace.
//
// What each backward saves: MaxPool2dBackward the argmax of every window as i32 offsets into
// its (H, W) plane, not the input: 4 bytes per *output* element (a 2x2/2 pool of f32 keeps a
// quarter of the input's bytes), no recomputation, and it does not keep the input alive for
// backward. Indices are made only when a gradient is needed. AvgPool2dBackward and
// GlobalAvgPool2dBackward save nothing (the gradient is dout spread evenly over each window).
// On cuda:N the same loops run one thread per element (ops/cuda/pool.cu).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cuda/launchers.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

struct PoolGeom {
  int64_t N, C, H, W, k, s, p, OH, OW;
  int64_t planes() const { return N * C; }
  int64_t hw() const { return H * W; }
  int64_t ohw() const { return OH * OW; }
};

int64_t plane_grain(const PoolGeom& g) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.ohw() * g.k * g.k)); }

PoolGeom check_pool(const char* op, const Tensor& x, const Pool2dParams& prm) {
  check_defined(op, x, "input");
  check_floating(op, x);
  check_dim(op, x, 4, "input (N, C, H, W)");
  const int64_t k = prm.kernel, s = prm.stride == 0 ? prm.kernel : prm.stride, p = prm.padding;
  MG_CHECK(k >= 1 && s >= 1 && p >= 0, op, ": invalid parameters kernel ", prm.kernel, ", stride ", prm.stride,
           ", padding ", prm.padding, " (need kernel >= 1, stride >= 0 with 0 meaning = kernel, padding >= 0)");
  MG_CHECK(2 * p <= k, op, ": padding ", p, " must be at most half the kernel size ", k);
  const int64_t H = x.size(2), W = x.size(3);
  const int64_t oh = H + 2 * p < k ? 0 : (H + 2 * p - k) / s + 1;
  const int64_t ow = W + 2 * p < k ? 0 : (W + 2 * p - k) / s + 1;
  MG_CHECK(oh > 0 && ow > 0, op, ": output size ", oh, "x", ow, " is not positive: input ", x.shape(), ", kernel ", k,
           ", stride ", s, ", padding ", p);
  return {x.size(0), x.size(1), H, W, k, s, p, oh, ow};
}

// A contiguous, autograd-free version of t (a workspace copy only when t is a strided view).
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t.detach();
  MemoryCategoryGuard cat(MemoryCategory::workspace);
  return contiguous(t.detach());
}

cuda::Pool2dGeom cuda_geom(const PoolGeom& g) { return {g.N, g.C, g.H, g.W, g.k, g.s, g.p, g.OH, g.OW}; }

// Max over each window (padding never wins); idx (if not null) gets the winner's h*W + w.
// NaN wins (the first NaN of the window), as in PyTorch.
template <class T>
void max_pool_forward(const PoolGeom& g, const T* x, T* out, int32_t* idx) {
  using A = compute_t<T>;
  parallel_for(0, g.planes(), plane_grain(g), [&](int64_t pb, int64_t pe) {
    for (int64_t pl = pb; pl < pe; ++pl) {
      const T* xp = x + pl * g.hw();
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t hs = oh * g.s - g.p, ws = ow * g.s - g.p;
          A best = -std::numeric_limits<A>::infinity();
          int64_t bi = std::max<int64_t>(hs, 0) * g.W + std::max<int64_t>(ws, 0);
          bool nan = false;
          for (int64_t ih = std::max<int64_t>(hs, 0); ih < std::min(hs + g.k, g.H) && !nan; ++ih)
            for (int64_t iw = std::max<int64_t>(ws, 0); iw < std::min(ws + g.k, g.W); ++iw) {
              const A v = A(xp[ih * g.W + iw]);
              if (v > best || std::isnan(v)) {
                best = v;
                bi = ih * g.W + iw;
                if (std::isnan(v)) {
                  nan = true;
                  break;
                }
              }
            }
          const int64_t o = pl * g.ohw() + oh * g.OW + ow;
          out[o] = T(best);
          if (idx) idx[o] = int32_t(bi);
        }
    }
  });
}

template <class T>
void max_pool_backward(const PoolGeom& g, const T* dout, const int32_t* idx, T* dx) {
  using A = compute_t<T>;
  parallel_for(0, g.planes(), plane_grain(g), [&](int64_t pb, int64_t pe) {
    for (int64_t pl = pb; pl < pe; ++pl) {
      T* d = dx + pl * g.hw();
      if constexpr (std::is_same_v<T, A>) {
        std::fill(d, d + g.hw(), T(0));
        for (int64_t o = pl * g.ohw(); o < (pl + 1) * g.ohw(); ++o) d[idx[o]] += dout[o];
      } else {  // overlapping windows (stride < kernel) may hit one element twice: add in f32
        std::fill(d, d + g.hw(), T(0.0f));
        for (int64_t o = pl * g.ohw(); o < (pl + 1) * g.ohw(); ++o) d[idx[o]] = T(A(d[idx[o]]) + A(dout[o]));
      }
    }
  });
}

template <class T>
void avg_pool_forward(const PoolGeom& g, const T* x, T* out) {
  using A = compute_t<T>;
  const A inv = A(1) / A(g.k * g.k);  // count_include_pad: padded zeros count
  parallel_for(0, g.planes(), plane_grain(g), [&](int64_t pb, int64_t pe) {
    for (int64_t pl = pb; pl < pe; ++pl) {
      const T* xp = x + pl * g.hw();
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t hs = oh * g.s - g.p, ws = ow * g.s - g.p;
          A acc = 0;
          for (int64_t ih = std::max<int64_t>(hs, 0); ih < std::min(hs + g.k, g.H); ++ih)
            for (int64_t iw = std::max<int64_t>(ws, 0); iw < std::min(ws + g.k, g.W); ++iw) acc += A(xp[ih * g.W + iw]);
          out[pl * g.ohw() + oh * g.OW + ow] = T(acc * inv);
        }
    }
  });
}

// dx plane accumulated in the compute type, one plane per task, windows in (oh, ow) order.
template <class T>
void avg_pool_backward(const PoolGeom& g, const T* dout, T* dx) {
  using A = compute_t<T>;
  const A inv = A(1) / A(g.k * g.k);
  parallel_for(0, g.planes(), plane_grain(g), [&](int64_t pb, int64_t pe) {
    for (int64_t pl = pb; pl < pe; ++pl) {
      T* d = dx + pl * g.hw();
      const T* gp = dout + pl * g.ohw();
      for (int64_t ih = 0; ih < g.H; ++ih)
        for (int64_t iw = 0; iw < g.W; ++iw) {
          // Windows covering (ih, iw): oh*s - p <= ih < oh*s - p + k.
          const int64_t oh_lo = std::max<int64_t>(0, (ih + g.p - g.k + g.s) / g.s);
          const int64_t oh_hi = std::min(g.OH - 1, (ih + g.p) / g.s);
          const int64_t ow_lo = std::max<int64_t>(0, (iw + g.p - g.k + g.s) / g.s);
          const int64_t ow_hi = std::min(g.OW - 1, (iw + g.p) / g.s);
          A acc = 0;
          for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
            for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) acc += A(gp[oh * g.OW + ow]);
          d[ih * g.W + iw] = T(acc * inv);
        }
    }
  });
}

class MaxPool2dBackward : public Node {
 public:
  MaxPool2dBackward(PoolGeom g, Shape x_shape) : g_(g), x_shape_(std::move(x_shape)) {}
  std::string_view name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    OpNameGuard op("max_pool2d_backward");
    Tensor dout = dense(grads[0]);  // (N, C, OH, OW)
    Tensor idx = indices.unpack();  // (N, C, OH, OW) i32
    Tensor dx = empty(x_shape_, {.dtype = dout.dtype(), .device = dout.device()});
    if (dx.device().is_cuda()) {
      cuda::max_pool2d_backward(cuda_geom(g_), dout, idx, dx);
      return {dx};
    }
    if (!skip_kernel(dx))
      MG_DISPATCH_FLOAT(dout.dtype(), "max_pool2d_backward",
                        [&] { max_pool_backward(g_, dout.data<scalar_t>(), idx.data<int32_t>(), dx.data<scalar_t>()); });
    return {dx};
  }
  SavedTensor indices{this};

 private:
  PoolGeom g_;
  Shape x_shape_;
};

class AvgPool2dBackward : public Node {
 public:
  AvgPool2dBackward(PoolGeom g, Shape x_shape) : g_(g), x_shape_(std::move(x_shape)) {}
  std::string_view name() const override { return "AvgPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    OpNameGuard op("avg_pool2d_backward");
    Tensor dout = dense(grads[0]);
    Tensor dx = empty(x_shape_, {.dtype = dout.dtype(), .device = dout.device()});
    if (dx.device().is_cuda()) {
      cuda::avg_pool2d_backward(cuda_geom(g_), dout, dx);
      return {dx};
    }
    if (!skip_kernel(dx))
      MG_DISPATCH_FLOAT(dout.dtype(), "avg_pool2d_backward",
                        [&] { avg_pool_backward(g_, dout.data<scalar_t>(), dx.data<scalar_t>()); });
    return {dx};
  }

 private:
  PoolGeom g_;
  Shape x_shape_;
};

class GlobalAvgPool2dBackward : public Node {
 public:
  explicit GlobalAvgPool2dBackward(Shape x_shape) : x_shape_(std::move(x_shape)) {}
  std::string_view name() const override { return "GlobalAvgPool2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    OpNameGuard op("global_avg_pool2d_backward");
    Tensor dout = dense(grads[0]);  // (N, C)
    Tensor dx = empty(x_shape_, {.dtype = dout.dtype(), .device = dout.device()});
    if (dx.device().is_cuda()) {
      cuda::global_avg_pool2d_backward(dout, dx);
      return {dx};
    }
    if (!skip_kernel(dx)) {
      const int64_t hw = x_shape_[2] * x_shape_[3];
      MG_DISPATCH_FLOAT(dout.dtype(), "global_avg_pool2d_backward", [&] {
        using A = compute_t<scalar_t>;
        const scalar_t* gp = dout.data<scalar_t>();
        scalar_t* d = dx.data<scalar_t>();
        parallel_for(0, dout.numel(), std::max<int64_t>(1, 32768 / hw), [&](int64_t b, int64_t e) {
          for (int64_t pl = b; pl < e; ++pl) std::fill(d + pl * hw, d + (pl + 1) * hw, scalar_t(A(gp[pl]) / A(hw)));
        });
      });
    }
    return {dx};
  }

 private:
  Shape x_shape_;
};

}  // namespace

// x: (N, C, H, W) -> (N, C, OH, OW), OH = (H + 2p - k)/s + 1
Tensor max_pool2d(const Tensor& x, Pool2dParams prm) {
  const char* op = "max_pool2d";
  PoolGeom g = check_pool(op, x, prm);
  MG_CHECK(g.hw() <= std::numeric_limits<int32_t>::max(), op, ": plane ", g.H, "x", g.W,
           " is too large for i32 argmax indices");
  OpNameGuard name(op);
  const bool need_grad = any_requires_grad({x});
  Tensor out = empty({g.N, g.C, g.OH, g.OW}, {.dtype = x.dtype(), .device = x.device()});
  Tensor idx = need_grad ? empty(out.shape(), {.dtype = DType::i32, .device = x.device()}) : Tensor();
  Tensor xc = dense(x);
  if (x.device().is_cuda()) cuda::max_pool2d_forward(cuda_geom(g), xc, out, idx);
  else if (!skip_kernel(out))
    MG_DISPATCH_FLOAT(x.dtype(), op, [&] {
      max_pool_forward(g, xc.data<scalar_t>(), out.data<scalar_t>(), need_grad ? idx.data<int32_t>() : nullptr);
    });
  if (auto node = make_node_if_needed<MaxPool2dBackward>({x}, g, x.shape())) {
    node->indices.save(idx);
    set_history(node, {x}, {out});
  }
  return out;
}

// x: (N, C, H, W) -> (N, C, OH, OW); each window's sum / k^2 (padding counts as zeros)
Tensor avg_pool2d(const Tensor& x, Pool2dParams prm) {
  const char* op = "avg_pool2d";
  PoolGeom g = check_pool(op, x, prm);
  OpNameGuard name(op);
  Tensor out = empty({g.N, g.C, g.OH, g.OW}, {.dtype = x.dtype(), .device = x.device()});
  Tensor xc = dense(x);
  if (x.device().is_cuda()) cuda::avg_pool2d_forward(cuda_geom(g), xc, out);
  else if (!skip_kernel(out))
    MG_DISPATCH_FLOAT(x.dtype(), op, [&] { avg_pool_forward(g, xc.data<scalar_t>(), out.data<scalar_t>()); });
  if (auto node = make_node_if_needed<AvgPool2dBackward>({x}, g, x.shape())) set_history(node, {x}, {out});
  return out;
}

// x: (N, C, H, W) -> (N, C), the mean of each plane (summed in order in f32, f64 for f64)
Tensor global_avg_pool2d(const Tensor& x) {
  const char* op = "global_avg_pool2d";
  check_defined(op, x, "input");
  check_floating(op, x);
  check_dim(op, x, 4, "input (N, C, H, W)");
  MG_CHECK(x.size(2) * x.size(3) > 0, op, ": input ", x.shape(), " has empty planes");
  OpNameGuard name(op);
  Tensor out = empty({x.size(0), x.size(1)}, {.dtype = x.dtype(), .device = x.device()});
  Tensor xc = dense(x);
  if (x.device().is_cuda()) cuda::global_avg_pool2d_forward(xc, out);
  else if (!skip_kernel(out)) {
    const int64_t hw = x.size(2) * x.size(3);
    MG_DISPATCH_FLOAT(x.dtype(), op, [&] {
      using A = compute_t<scalar_t>;
      const scalar_t* xp = xc.data<scalar_t>();
      scalar_t* o = out.data<scalar_t>();
      parallel_for(0, out.numel(), std::max<int64_t>(1, 32768 / hw), [&](int64_t b, int64_t e) {
        for (int64_t pl = b; pl < e; ++pl) {
          A acc = 0;
          for (int64_t i = 0; i < hw; ++i) acc += A(xp[pl * hw + i]);
          o[pl] = scalar_t(acc / A(hw));
        }
      });
    });
  }
  if (auto node = make_node_if_needed<GlobalAvgPool2dBackward>({x}, x.shape())) set_history(node, {x}, {out});
  return out;
}

}  // namespace mg
