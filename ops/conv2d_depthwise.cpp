// Direct depthwise convolution: groups == Cin, weight (Cout, 1, KH, KW) with Cout = Cin * M
// (M the channel multiplier; MobileNetV2's 3x3 blocks have M = 1). Output channel c reads only
// input channel c / M, so each output plane is a sum of KH*KW shifted, scaled rows of one input
// plane: no im2col, O(N*Cout*OH*OW*KH*KW) work and, in f32/f64, no workspace at all.
// Determinism: each output plane, each dx plane and each channel of dW is computed by one thread
// in a fixed order, and dW sums the images n = 0, 1, ... in that order.
// f16/bf16: groups of images are staged in f32 workspace (ops/f32_staging.h), computed, and
// rounded on store. These plane kernels are the reference; convolutions whose planes fit the
// channel tiles run ops/conv2d_depthwise_lanes.cpp instead (f32 directly, 16-bit on the staged
// images): the output and dx with the same bits, dW in that file's own fixed order.
#include <algorithm>
#include <type_traits>

#include "core/parallel.h"
#include "ops/conv2d_depthwise.h"
#include "ops/f32_staging.h"
#include "ops/op_utils.h"

namespace mg {
namespace detail {
namespace {

DwGeom make_dw_geom(const Shape& xs, const Shape& ws, const Shape& os, int64_t stride, int64_t pad) {
  return {xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], os[2], os[3], stride, pad, ws[0] / xs[1]};
}

// Outputs o in [lo, hi) read an in-bounds input 0 <= o*s - pad + k < in.
void valid_range(int64_t in, int64_t out, int64_t k, int64_t s, int64_t pad, int64_t& lo, int64_t& hi) {
  int64_t a = pad - k, b = in - 1 + pad - k;
  lo = a > 0 ? (a + s - 1) / s : 0;
  hi = b < 0 ? 0 : std::min(out, b / s + 1);
  lo = std::min(lo, hi);
}

DepthwiseKernel g_kernel = DepthwiseKernel::automatic;

// The lane count the kernel choice asks for: 0 for the reference.
int chosen_lanes() {
  switch (g_kernel) {
    case DepthwiseKernel::reference: return 0;
    case DepthwiseKernel::scalar: return 1;
    case DepthwiseKernel::lanes8: return 8;
    case DepthwiseKernel::lanes16: return 16;
    case DepthwiseKernel::automatic: break;
  }
#ifdef __AVX512F__
  return 16;
#else
  return 8;
#endif
}

// The lane count of the channel-vectorised kernel (ops/conv2d_depthwise_lanes.cpp) for g's output
// and dx, or 0 for the reference below.
int lanes_for(const DwGeom& g) {
  const int lanes = chosen_lanes();
  return lanes && depthwise_lanes(g, lanes) ? lanes : 0;
}

// The same for g's dW.
int weight_lanes_for(const DwGeom& g) {
  const int lanes = chosen_lanes();
  return lanes && depthwise_lanes_weight(g, lanes) ? lanes : 0;
}

int64_t plane_grain(const DwGeom& g) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.kk() * g.ohw())); }

// One output plane: o (OH, OW) = bias + sum over (kh, kw) of w[kh, kw] * shifted x (H, W).
template <class A>
void plane_forward(const DwGeom& g, const A* x, const A* w, A bias, A* o) {
  std::fill(o, o + g.ohw(), bias);
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    int64_t oh_lo, oh_hi;
    valid_range(g.H, g.OH, kh, g.stride, g.pad, oh_lo, oh_hi);
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const A wv = w[kh * g.KW + kw];
      int64_t lo, hi;
      valid_range(g.W, g.OW, kw, g.stride, g.pad, lo, hi);
      for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
        const A* xr = x + (oh * g.stride - g.pad + kh) * g.W + (kw - g.pad);  // xr[ow*s] = x[ih, iw]
        A* orow = o + oh * g.OW;
        if (g.stride == 1)
          for (int64_t ow = lo; ow < hi; ++ow) orow[ow] += wv * xr[ow];
        else
          for (int64_t ow = lo; ow < hi; ++ow) orow[ow] += wv * xr[ow * g.stride];
      }
    }
  }
}

// dx plane (H, W) of one input channel: overwritten with the scatter of its M output planes.
template <class A>
void plane_backward_input(const DwGeom& g, const A* dout, const A* w, A* dx) {
  std::fill(dx, dx + g.hw(), A(0));
  for (int64_t m = 0; m < g.mult; ++m) {
    const A* d = dout + m * g.ohw();  // (OH, OW) of output channel ci*M + m
    const A* wm = w + m * g.kk();
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      int64_t oh_lo, oh_hi;
      valid_range(g.H, g.OH, kh, g.stride, g.pad, oh_lo, oh_hi);
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const A wv = wm[kh * g.KW + kw];
        int64_t lo, hi;
        valid_range(g.W, g.OW, kw, g.stride, g.pad, lo, hi);
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          A* dr = dx + (oh * g.stride - g.pad + kh) * g.W + (kw - g.pad);
          const A* gr = d + oh * g.OW;
          if (g.stride == 1)
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow] += wv * gr[ow];
          else
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow * g.stride] += wv * gr[ow];
        }
      }
    }
  }
}

// dw (KH*KW) of one output channel += correlation of its dout plane with its input plane.
template <class A>
void plane_backward_weight(const DwGeom& g, const A* dout, const A* x, A* dw) {
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    int64_t oh_lo, oh_hi;
    valid_range(g.H, g.OH, kh, g.stride, g.pad, oh_lo, oh_hi);
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      int64_t lo, hi;
      valid_range(g.W, g.OW, kw, g.stride, g.pad, lo, hi);
      // Eight running sums (lane ow % 8 within the row), added up at the end: a fixed order
      // that the compiler can vectorise (one serial sum would be latency-bound).
      A part[8] = {};
      A tail = 0;
      for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
        const A* xr = x + (oh * g.stride - g.pad + kh) * g.W + (kw - g.pad);
        const A* gr = dout + oh * g.OW;
        int64_t ow = lo;
        if (g.stride == 1)
          for (; ow + 8 <= hi; ow += 8)
            for (int j = 0; j < 8; ++j) part[j] += gr[ow + j] * xr[ow + j];
        else
          for (; ow + 8 <= hi; ow += 8)
            for (int j = 0; j < 8; ++j) part[j] += gr[ow + j] * xr[(ow + j) * g.stride];
        for (; ow < hi; ++ow) tail += gr[ow] * xr[ow * g.stride];
      }
      A acc = tail;
      for (int j = 0; j < 8; ++j) acc += part[j];
      dw[kh * g.KW + kw] += acc;  // this image's sum, added after the previous images'
    }
  }
}

// Images [n, n + count) of contiguous t (per_image values each) in compute type A: t's own
// data, or converted into buf.
template <class T, class A>
const A* images_in(const Tensor& t, int64_t n, int64_t count, int64_t per_image, const Tensor& buf) {
  const T* p = t.data<T>() + n * per_image;
  if constexpr (std::is_same_v<T, A>) {
    return p;
  } else {
    convert_n(p, buf.data<A>(), count * per_image);
    return buf.data<A>();
  }
}

template <class T>
void forward_kernel(const DwGeom& g, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  using A = compute_t<T>;
  constexpr bool low = !std::is_same_v<T, A>;
  const TensorOptions ws{.dtype = dtype_of_v<A>, .device = out.device()};
  const int64_t group = low ? staged_images(std::max(g.Cin * g.hw(), g.Cout * g.ohw()), g.N) : g.N;
  const int lanes = std::is_same_v<A, float> ? lanes_for(g) : 0;  // 16-bit: on the staged f32 images
  Tensor xbuf, wbuf, obuf, bbuf;
  if (low) {
    MemoryCategoryGuard cat(MemoryCategory::workspace);
    xbuf = empty({group, g.Cin, g.hw()}, ws);    // a group of x images in f32
    wbuf = empty(w.shape(), ws);                 // (Cout, 1, KH, KW) in f32
    obuf = empty({group, g.Cout, g.ohw()}, ws);  // their outputs in f32
    if (lanes && bias.defined()) bbuf = empty(bias.shape(), ws);  // the lanes read an f32 bias
  }
  if (skip_kernel(out)) return;
  const A* wp = images_in<T, A>(w, 0, 1, w.numel(), wbuf);
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  const A* bpa = bbuf.defined() ? images_in<T, A>(bias, 0, 1, bias.numel(), bbuf) : nullptr;
  // out planes of `count` images from their x planes: one task per (image, channel) plane.
  auto planes = [&](int64_t count, const A* xs, A* os) {
    parallel_for(0, count * g.Cout, plane_grain(g), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        const int64_t n = p / g.Cout, c = p % g.Cout;
        plane_forward(g, xs + (n * g.Cin + c / g.mult) * g.hw(), wp + c * g.kk(), bp ? A(compute_t<T>(bp[c])) : A(0),
                      os + p * g.ohw());
      }
    });
  };
  if constexpr (std::is_same_v<T, float>) {
    if (lanes) {
      depthwise_lanes_forward(g, lanes, g.N, x.data<T>(), wp, bp, out.data<T>());
      return;
    }
  }
  if constexpr (!low) {
    planes(g.N, x.data<T>(), out.data<T>());  // the whole batch in one pass
  } else {
    for (int64_t n = 0; n < g.N; n += group) {  // a group of images at a time through f32 workspace
      const int64_t k = std::min(group, g.N - n);
      const A* xs = images_in<T, A>(x, n, k, g.Cin * g.hw(), xbuf);
      if (lanes) depthwise_lanes_forward(g, lanes, k, xs, wp, bpa, obuf.data<A>());
      else planes(k, xs, obuf.data<A>());
      convert_n(obuf.data<A>(), out.data<T>() + n * g.Cout * g.ohw(), k * g.Cout * g.ohw());
    }
  }
}

template <class T>
void backward_kernel(const DwGeom& g, const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                     const Tensor& dw) {
  using A = compute_t<T>;
  constexpr bool low = !std::is_same_v<T, A>;
  const bool need_dx = dx.defined(), need_dw = dw.defined();
  const TensorOptions ws{.dtype = dtype_of_v<A>, .device = dout.device()};
  const int64_t group = low ? staged_images(std::max(g.Cin * g.hw(), g.Cout * g.ohw()), g.N) : g.N;
  Tensor dobuf, xbuf, wbuf, dxbuf, dwbuf;
  if (low) {
    MemoryCategoryGuard cat(MemoryCategory::workspace);
    dobuf = empty({group, g.Cout, g.ohw()}, ws);             // a group of dout images in f32
    if (need_dw) xbuf = empty({group, g.Cin, g.hw()}, ws);   // their x in f32
    if (need_dw) dwbuf = empty(dw.shape(), ws);              // f32 accumulator of dW
    if (need_dx) wbuf = empty(w.shape(), ws);
    if (need_dx) dxbuf = empty({group, g.Cin, g.hw()}, ws);  // their dx in f32 before rounding
  }
  if (dout.is_meta()) return;
  A* dwp = nullptr;  // (Cout, KH*KW)
  if (need_dw) {
    if constexpr (low) dwp = dwbuf.data<A>();
    else dwp = dw.data<T>();
    std::fill(dwp, dwp + dw.numel(), A(0));
  }
  const A* wp = need_dx ? images_in<T, A>(w, 0, 1, w.numel(), wbuf) : nullptr;
  // dW += the contribution of `count` images: one task per channel (block), images in order.
  auto weight_pass = [&](int64_t count, const A* dos, const A* xs) {
    if constexpr (std::is_same_v<A, float>) {
      if (const int lanes = weight_lanes_for(g)) {
        depthwise_lanes_backward_weight(g, lanes, count, dos, xs, dwp);
        return;
      }
    }
    const int64_t grain = std::max<int64_t>(1, plane_grain(g) / count);
    parallel_for(0, g.Cout, grain, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c)
        for (int64_t n = 0; n < count; ++n)
          plane_backward_weight(g, dos + (n * g.Cout + c) * g.ohw(), xs + (n * g.Cin + c / g.mult) * g.hw(),
                                dwp + c * g.kk());
    });
  };
  // dx planes of `count` images: one task per (image, input channel) plane.
  auto input_pass = [&](int64_t count, const A* dos, A* dxs) {
    parallel_for(0, count * g.Cin, plane_grain(g), [&](int64_t pb, int64_t pe) {
      for (int64_t p = pb; p < pe; ++p) {
        const int64_t n = p / g.Cin, ci = p % g.Cin;
        plane_backward_input(g, dos + (n * g.Cout + ci * g.mult) * g.ohw(), wp + ci * g.mult * g.kk(), dxs + p * g.hw());
      }
    });
  };
  const int lanes = std::is_same_v<A, float> ? lanes_for(g) : 0;  // 16-bit: on the staged f32 images
  if constexpr (std::is_same_v<T, float>) {
    if (lanes) {  // dx on the channel lanes (dW picks its own kernel)
      if (need_dw) weight_pass(g.N, dout.data<T>(), x.data<T>());
      if (need_dx) depthwise_lanes_backward_input(g, lanes, g.N, dout.data<T>(), wp, dx.data<T>());
      return;
    }
  }
  if constexpr (!low) {  // the whole batch in one pass each
    if (need_dw) weight_pass(g.N, dout.data<T>(), x.data<T>());
    if (need_dx) input_pass(g.N, dout.data<T>(), dx.data<T>());
  } else {  // a group of images at a time through f32 workspace; dW still sums images in order
    for (int64_t n = 0; n < g.N; n += group) {
      const int64_t k = std::min(group, g.N - n);
      const A* don = images_in<T, A>(dout, n, k, g.Cout * g.ohw(), dobuf);
      if (need_dw) weight_pass(k, don, images_in<T, A>(x, n, k, g.Cin * g.hw(), xbuf));
      if (need_dx) {
        if (lanes) depthwise_lanes_backward_input(g, lanes, k, don, wp, dxbuf.data<A>());
        else input_pass(k, don, dxbuf.data<A>());
        convert_n(dxbuf.data<A>(), dx.data<T>() + n * g.Cin * g.hw(), k * g.Cin * g.hw());
      }
    }
    if (need_dw) convert_n(dwp, dw.data<T>(), dw.numel());
  }
}

}  // namespace

void set_depthwise_kernel(DepthwiseKernel k) { g_kernel = k; }
DepthwiseKernel depthwise_kernel() { return g_kernel; }

// All contiguous; shapes were checked by conv2d.
void depthwise_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                              int64_t stride, int64_t padding) {
  DwGeom g = make_dw_geom(x.shape(), w.shape(), out.shape(), stride, padding);
  MG_DISPATCH_FLOAT(out.dtype(), "conv2d", [&] { forward_kernel<scalar_t>(g, x, w, bias, out); });
}

void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                               const Tensor& dw, int64_t stride, int64_t padding) {
  const Shape& xs = dx.defined() ? dx.shape() : x.shape();
  const Shape& wsh = dw.defined() ? dw.shape() : w.shape();
  DwGeom g = make_dw_geom(xs, wsh, dout.shape(), stride, padding);
  MG_DISPATCH_FLOAT(dout.dtype(), "conv2d_backward", [&] { backward_kernel<scalar_t>(g, x, w, dout, dx, dw); });
}

}  // namespace detail
}  // namespace mg
