// conv2d: 2-D convolution as im2col + GEMM (any groups), with a direct kernel for depthwise
// convolutions in conv2d_depthwise.cpp. Per image n and group g (G groups):
//   col = im2col(x[n])                          // (Cin*KH*KW, OH*OW), one image at a time
//   out[n, g] = W[g] @ col[g] + bias[g]         // (Cout/G, Cin/G*KH*KW) @ (Cin/G*KH*KW, OH*OW)
// Backward: dx[n] = col2im(W[g]^T @ dout[n, g]); dW[g] += dout[n, g] @ col[g]^T, summed over
// n = 0, 1, ... in that order; db = sum of dout over (n, oh, ow). See Note [Conv2d workspace]
// for the scratch memory and Note [Conv2d GEMM tiles] for why results have the same bits on any
// thread count.
//
// What Conv2dBackward saves: x only if the weight needs a gradient (dW reads the columns of x,
// recomputed per image rather than kept: a saved col would be KH*KW times the size of x), the
// weight only if x needs a gradient (dx), nothing for the bias (db reads only dout).
// On cuda:N every conv (depthwise too) runs on cuDNN (ops/cuda/conv2d.cu), workspace likewise tagged.
#include <algorithm>
#include <type_traits>

#include "core/parallel.h"
#include "core/flop_counter.h"
#include "ops/autocast_policy.h"
#include "ops/conv2d_depthwise.h"
#include "ops/cpu_gemm.h"
#include "ops/cuda/launchers.h"
#include "ops/f32_staging.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {

namespace {

// Note [Conv2d workspace]
// Every scratch buffer is an mg::empty tensor tagged `workspace`, allocated once per call and
// reused for every image, so the workspace is bounded by one image (or one staged group)
// whatever the batch:
//   forward:  col (Cin*KH*KW, OH*OW) in the compute type (f32, or f64 for f64 inputs); none for
//             a pointwise (1x1, stride 1, no padding) conv, whose GEMM reads x itself.
//   backward: col as above when dW is needed, dcol (Cin*KH*KW, OH*OW) when dx is needed.
//   f16/bf16 add f32 copies of the weight and of one image's dout / output / dx, and an f32 dW
//   accumulator; the result is rounded on store. A pointwise f16/bf16 conv stages a group of
//   images in f32 instead (x, out, dout, dx; at most 512 KiB each, ops/f32_staging.h), so each
//   group is one GEMM over several images.
// E.g. MobileNetV2's first conv (3 -> 32, 3x3, 224x224, stride 2): col = 27 x 12544 f32 = 1.3 MiB.

struct ConvGeom {
  int64_t N, Cin, H, W, Cout, KH, KW, OH, OW, stride, pad, groups;
  int64_t cig() const { return Cin / groups; }    // input channels per group
  int64_t cog() const { return Cout / groups; }   // output channels per group
  int64_t wrow() const { return cig() * KH * KW; }  // one output channel's weights = rows of col[g]
  int64_t col_rows() const { return Cin * KH * KW; }
  int64_t hw() const { return H * W; }
  int64_t ohw() const { return OH * OW; }
  bool pointwise() const { return KH == 1 && KW == 1 && stride == 1 && pad == 0; }
};

int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  int64_t span = in + 2 * pad - k;
  return span < 0 ? 0 : span / stride + 1;
}

ConvGeom make_geom(const Shape& xs, const Shape& ws, const Conv2dParams& p) {
  return {xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], out_size(xs[2], ws[2], p.stride, p.padding),
          out_size(xs[3], ws[3], p.stride, p.padding), p.stride, p.padding, p.groups};
}

bool is_depthwise(const ConvGeom& g) { return g.groups == g.Cin && g.Cin > 1; }

cuda::Conv2dGeom cuda_geom(const ConvGeom& g) {
  return {g.N, g.Cin, g.H, g.W, g.Cout, g.KH, g.KW, g.OH, g.OW, g.stride, g.pad, g.groups};
}

// Outputs o in [lo, hi) read an in-bounds input 0 <= o*s - pad + k < in.
void valid_range(int64_t in, int64_t out, int64_t k, int64_t s, int64_t pad, int64_t& lo, int64_t& hi) {
  int64_t a = pad - k, b = in - 1 + pad - k;
  lo = a > 0 ? (a + s - 1) / s : 0;
  hi = b < 0 ? 0 : std::min(out, b / s + 1);
  lo = std::min(lo, hi);
}

// Rows of KH*KW*OH*OW elements per chunk of channels: about 32 K elements of work each.
int64_t channel_grain(const ConvGeom& g) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, g.KH * g.KW * g.ohw())); }

// x: (Cin, H, W) of one image -> col: (Cin*KH*KW, OH*OW), zero where the window is in padding.
template <class T, class A>
void im2col(const ConvGeom& g, const T* x, A* col) {
  parallel_for(0, g.Cin, channel_grain(g), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c)
      for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          A* row = col + ((c * g.KH + kh) * g.KW + kw) * g.ohw();
          int64_t lo, hi;
          valid_range(g.W, g.OW, kw, g.stride, g.pad, lo, hi);
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            A* r = row + oh * g.OW;
            int64_t ih = oh * g.stride - g.pad + kh;
            if (ih < 0 || ih >= g.H) {
              std::fill(r, r + g.OW, A(0));
              continue;
            }
            const T* xr = x + (c * g.H + ih) * g.W + (kw - g.pad);  // xr[ow * s] = x[c, ih, iw]
            std::fill(r, r + lo, A(0));
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = A(xr[ow * g.stride]);
            std::fill(r + hi, r + g.OW, A(0));
          }
        }
  });
}

// col: (Cin*KH*KW, OH*OW) -> dx: (Cin, H, W), overwritten. Each channel is summed by one thread
// in a fixed (kh, kw, oh, ow) order, so the bits do not depend on the thread count.
template <class A>
void col2im(const ConvGeom& g, const A* col, A* dx) {
  parallel_for(0, g.Cin, channel_grain(g), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      A* d = dx + c * g.hw();
      std::fill(d, d + g.hw(), A(0));
      for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const A* row = col + ((c * g.KH + kh) * g.KW + kw) * g.ohw();
          int64_t lo, hi;
          valid_range(g.W, g.OW, kw, g.stride, g.pad, lo, hi);
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            int64_t ih = oh * g.stride - g.pad + kh;
            if (ih < 0 || ih >= g.H) continue;
            A* dr = d + ih * g.W + (kw - g.pad);
            const A* r = row + oh * g.OW;
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow * g.stride] += r[ow];
          }
        }
    }
  });
}

// Note [Conv2d GEMM tiles]
// OpenBLAS's own threading gives different bits for 1 and 2 threads (measured: OpenBLAS 0.3.21,
// OpenMP build, sgemm 32x256x288 differs in half the elements). So every GEMM here is cut into
// fixed tiles of C, kTileRows x kTileCols, whatever the thread count; each tile is one
// single-threaded BLAS call (OpenBLAS runs on one thread inside an OpenMP region, and a lone
// tile runs with the thread count set to 1), and the tiles run in parallel. Each element of C
// then has one summation order, so results have the same bits on any number of threads.
// Pointwise f32/f64 convs need no im2col, so their tiles span the whole batch: one parallel
// region per GEMM rather than one per image (regions are what a busy machine makes expensive).
constexpr int64_t kTileRows = 128, kTileCols = 256;

// Sets this thread's thread count to 1 for a scope (the OpenMP setting is per thread).
class SingleThreadScope {
 public:
  SingleThreadScope() : saved_(num_threads()) { set_num_threads(1); }
  ~SingleThreadScope() { set_num_threads(saved_); }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int saved_;
};

// A GEMM per (image n, group g): C[n, g] = op(A[n, g]) @ op(B[n, g]) + beta * C[n, g], each C
// (M, N) row-major, operand X[n, g] at x + n * x_image + g * x_group. Images::summed instead adds
// every image into one C[g] in the order n = 0, 1, ... (beta applies to image 0 only): how dW
// sums the batch in a fixed order.
enum class Images { separate, summed };

template <class A>
struct BatchedGemm {
  Transpose ta, tb;
  int64_t M, N, K;
  const A* a;
  int64_t lda, a_group, a_image;
  const A* b;
  int64_t ldb, b_group, b_image;
  A* c;
  int64_t ldc, c_group, c_image;
  A beta = 0;
  const A* row_init = nullptr;  // if set, C[n, g] row i starts at row_init[g * M + i] (beta = 1)
};

template <class A>
void gemm_tiled(const BatchedGemm<A>& m, int64_t groups, int64_t images, Images mode) {
  const int64_t rb = (m.M + kTileRows - 1) / kTileRows, cb = (m.N + kTileCols - 1) / kTileCols;
  const int64_t per_image = groups * rb * cb;
  const bool summed = mode == Images::summed;
  auto tile = [&](int64_t t) {
    const int64_t r = t % per_image, g = r / (rb * cb), i0 = (r / cb) % rb * kTileRows, j0 = r % cb * kTileCols;
    const int64_t rows = std::min(kTileRows, m.M - i0), cols = std::min(kTileCols, m.N - j0);
    const int64_t n_begin = summed ? 0 : t / per_image, n_end = summed ? images : n_begin + 1;
    for (int64_t n = n_begin; n < n_end; ++n) {
      // Row i0 of op(A) and column j0 of op(B), wherever the transposes put them in memory.
      const A* a = m.a + n * m.a_image + g * m.a_group + (m.ta == Transpose::no ? i0 * m.lda : i0);
      const A* b = m.b + n * m.b_image + g * m.b_group + (m.tb == Transpose::no ? j0 : j0 * m.ldb);
      A* c = m.c + n * m.c_image + g * m.c_group + i0 * m.ldc + j0;
      A beta = summed && n > 0 ? A(1) : m.beta;
      if (m.row_init && (!summed || n == 0)) {  // the bias, written just before the tile is used
        for (int64_t i = 0; i < rows; ++i) std::fill(c + i * m.ldc, c + i * m.ldc + cols, m.row_init[g * m.M + i0 + i]);
        beta = A(1);
      }
      cpu_gemm(m.ta, m.tb, rows, cols, m.K, A(1), a, m.lda, b, m.ldb, beta, c, m.ldc);
    }
  };
  // Tiles per task: about 1 MFLOP of work each, so small GEMMs do not pay for a thread team.
  const int64_t tasks = summed ? per_image : images * per_image;
  const int64_t task_flops = std::max<int64_t>(
      1, 2 * std::min(kTileRows, m.M) * std::min(kTileCols, m.N) * std::max<int64_t>(m.K, 1) * (summed ? images : 1));
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / task_flops);
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) tile(t);
  };
  if (tasks <= grain && !in_parallel_region()) {  // one task: run it here, BLAS on one thread
    SingleThreadScope one;
    run(0, tasks);
    return;
  }
  parallel_for(0, tasks, grain, run);
}

// The data of contiguous `t` in compute type A: t itself, or converted into `buf` (f16/bf16).
template <class T, class A = compute_t<T>>
const A* as_compute(const Tensor& t, const Tensor& buf) {
  if constexpr (std::is_same_v<T, A>) {
    return t.data<T>();
  } else {
    convert_n(t.data<T>(), buf.data<A>(), t.numel());
    return buf.data<A>();
  }
}

template <class T>
void conv2d_forward_gemm(const ConvGeom& g, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  using A = compute_t<T>;
  constexpr bool low = !std::is_same_v<T, A>;  // f16/bf16: f32 workspace, round on store
  const bool pw = g.pointwise();               // the GEMM reads the (staged) images themselves
  const int64_t group = low && pw ? staged_images(std::max(g.Cin * g.hw(), g.Cout * g.ohw()), g.N) : 1;
  const TensorOptions ws{.dtype = dtype_of_v<A>, .device = out.device()};
  Tensor col, wbuf, bbuf, xbuf, obuf;
  {
    MemoryCategoryGuard cat(MemoryCategory::workspace);
    if (!pw) col = empty({g.col_rows(), g.ohw()}, ws);  // (Cin*KH*KW, OH*OW)
    if (low) {
      wbuf = empty(w.shape(), ws);                           // (Cout, Cin/G, KH, KW)
      if (bias.defined()) bbuf = empty(bias.shape(), ws);    // (Cout)
      if (pw) xbuf = empty({group, g.Cin, g.hw()}, ws);      // a group of images
      obuf = empty({group, g.Cout, g.ohw()}, ws);            // their outputs (Cout, OH*OW)
    }
  }
  if (skip_kernel(out)) return;
  const A* wp = as_compute<T>(w, wbuf);
  const A* bp = bias.defined() ? as_compute<T>(bias, bbuf) : nullptr;
  const T* xp = x.data<T>();
  T* outp = out.data<T>();
  // Pointwise: o[n, g] = bias[g] + W[g] @ xs[n, g] for `images` images in one tiled GEMM.
  auto pointwise = [&](const A* xs, A* o, int64_t images) {
    gemm_tiled<A>({Transpose::no, Transpose::no, g.cog(), g.ohw(), g.wrow(), wp, g.wrow(), g.cog() * g.wrow(), 0, xs,
                   g.ohw(), g.wrow() * g.ohw(), g.Cin * g.hw(), o, g.ohw(), g.cog() * g.ohw(), g.Cout * g.ohw(), A(0),
                   bp},
                  g.groups, images, Images::separate);
  };
  if (pw) {
    if constexpr (!low) {
      pointwise(xp, outp, g.N);  // the whole batch at once
    } else {
      for (int64_t n = 0; n < g.N; n += group) {  // a group of images staged in f32
        const int64_t k = std::min(group, g.N - n);
        convert_n(xp + n * g.Cin * g.hw(), xbuf.data<A>(), k * g.Cin * g.hw());
        pointwise(xbuf.data<A>(), obuf.data<A>(), k);
        convert_n(obuf.data<A>(), outp + n * g.Cout * g.ohw(), k * g.Cout * g.ohw());
      }
    }
    return;
  }
  for (int64_t n = 0; n < g.N; ++n) {
    im2col<T, A>(g, xp + n * g.Cin * g.hw(), col.data<A>());
    A* on;  // (Cout, OH*OW)
    if constexpr (low) on = obuf.data<A>();
    else on = outp + n * g.Cout * g.ohw();
    // out[n, g] (Cout/G, OH*OW) = bias[g] + W[g] (Cout/G, Cin/G*KH*KW) @ col[g] (Cin/G*KH*KW, OH*OW)
    gemm_tiled<A>({Transpose::no, Transpose::no, g.cog(), g.ohw(), g.wrow(), wp, g.wrow(), g.cog() * g.wrow(), 0,
                   col.data<A>(), g.ohw(), g.wrow() * g.ohw(), 0, on, g.ohw(), g.cog() * g.ohw(), 0, A(0), bp},
                  g.groups, 1, Images::separate);
    if constexpr (low) convert_n(on, outp + n * g.Cout * g.ohw(), g.Cout * g.ohw());
  }
}

// dx (if defined) from w; dw (if defined) from x; both from dout. All contiguous.
template <class T>
void conv2d_backward_gemm(const ConvGeom& g, const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                          const Tensor& dw) {
  using A = compute_t<T>;
  constexpr bool low = !std::is_same_v<T, A>;
  const bool need_dx = dx.defined(), need_dw = dw.defined();
  const bool pw = g.pointwise();
  const int64_t group = low && pw ? staged_images(std::max(g.Cin * g.hw(), g.Cout * g.ohw()), g.N) : 1;
  const TensorOptions ws{.dtype = dtype_of_v<A>, .device = dout.device()};
  Tensor col, dcol, wbuf, dobuf, xbuf, dxbuf, dwbuf;
  {
    MemoryCategoryGuard cat(MemoryCategory::workspace);
    if (need_dw && !pw) col = empty({g.col_rows(), g.ohw()}, ws);   // columns of x[n]
    if (need_dx && !pw) dcol = empty({g.col_rows(), g.ohw()}, ws);  // W^T @ dout[n]
    if (low) {
      dobuf = empty({group, g.Cout, g.ohw()}, ws);             // dout images in f32
      if (need_dx) wbuf = empty(w.shape(), ws);
      if (need_dw && pw) xbuf = empty({group, g.Cin, g.hw()}, ws);  // their x in f32
      if (need_dx) dxbuf = empty({group, g.Cin, g.hw()}, ws);  // their dx in f32 before rounding
      if (need_dw) dwbuf = empty(dw.shape(), ws);              // f32 accumulator of dW
    }
  }
  if (dout.is_meta()) return;
  if (g.N == 0 || g.ohw() == 0) {  // nothing flows back: dW is zero
    if (need_dw) fill_(dw, 0.0);
    if (need_dx) fill_(dx, 0.0);
    return;
  }
  const A* wp = need_dx ? as_compute<T>(w, wbuf) : nullptr;
  A* dwp = nullptr;  // (Cout, Cin/G*KH*KW)
  if (need_dw) {
    if constexpr (low) dwp = dwbuf.data<A>();
    else dwp = dw.data<T>();
  }
  // Pointwise, `images` images per GEMM, reading x and writing dx in place:
  //   dW[g] (+)= sum over n in order of dout[n, g] (Cout/G, HW) @ x[n, g]^T (HW, Cin/G)
  //   dx[n, g] (Cin/G, HW) = W[g]^T @ dout[n, g]
  auto pointwise = [&](const A* dp, const A* xs, A* dxs, int64_t images, bool first) {
    if (need_dw)
      gemm_tiled<A>({Transpose::no, Transpose::yes, g.cog(), g.wrow(), g.ohw(), dp, g.ohw(), g.cog() * g.ohw(),
                     g.Cout * g.ohw(), xs, g.ohw(), g.wrow() * g.ohw(), g.Cin * g.hw(), dwp, g.wrow(),
                     g.cog() * g.wrow(), 0, A(first ? 0 : 1)},
                    g.groups, images, Images::summed);
    if (need_dx)
      gemm_tiled<A>({Transpose::yes, Transpose::no, g.wrow(), g.ohw(), g.cog(), wp, g.wrow(), g.cog() * g.wrow(), 0, dp,
                     g.ohw(), g.cog() * g.ohw(), g.Cout * g.ohw(), dxs, g.ohw(), g.wrow() * g.ohw(), g.Cin * g.hw(),
                     A(0)},
                    g.groups, images, Images::separate);
  };
  if (pw) {
    if constexpr (!low) {
      pointwise(dout.data<T>(), need_dw ? x.data<T>() : nullptr, need_dx ? dx.data<T>() : nullptr, g.N, true);
    } else {
      for (int64_t n = 0; n < g.N; n += group) {  // a group of images staged in f32
        const int64_t k = std::min(group, g.N - n);
        convert_n(dout.data<T>() + n * g.Cout * g.ohw(), dobuf.data<A>(), k * g.Cout * g.ohw());
        if (need_dw) convert_n(x.data<T>() + n * g.Cin * g.hw(), xbuf.data<A>(), k * g.Cin * g.hw());
        pointwise(dobuf.data<A>(), need_dw ? xbuf.data<A>() : nullptr, need_dx ? dxbuf.data<A>() : nullptr, k, n == 0);
        if (need_dx) convert_n(dxbuf.data<A>(), dx.data<T>() + n * g.Cin * g.hw(), k * g.Cin * g.hw());
      }
      if (need_dw) convert_n(dwp, dw.data<T>(), dw.numel());
    }
    return;
  }
  for (int64_t n = 0; n < g.N; ++n) {
    const A* don;  // dout[n] (Cout, OH*OW) in the compute type
    if constexpr (low) {
      convert_n(dout.data<T>() + n * g.Cout * g.ohw(), dobuf.data<A>(), g.Cout * g.ohw());
      don = dobuf.data<A>();
    } else {
      don = dout.data<T>() + n * g.Cout * g.ohw();
    }
    if (need_dw) {
      im2col<T, A>(g, x.data<T>() + n * g.Cin * g.hw(), col.data<A>());
      // dW[g] (+)= dout[n, g] @ col[g]^T; image 0 overwrites, later images accumulate in order.
      gemm_tiled<A>({Transpose::no, Transpose::yes, g.cog(), g.wrow(), g.ohw(), don, g.ohw(), g.cog() * g.ohw(), 0,
                     col.data<A>(), g.ohw(), g.wrow() * g.ohw(), 0, dwp, g.wrow(), g.cog() * g.wrow(), 0,
                     A(n == 0 ? 0 : 1)},
                    g.groups, 1, Images::separate);
    }
    if (need_dx) {
      // dcol[g] (Cin/G*KH*KW, OH*OW) = W[g]^T @ dout[n, g] (Cout/G, OH*OW), then dx[n] = col2im(dcol)
      gemm_tiled<A>({Transpose::yes, Transpose::no, g.wrow(), g.ohw(), g.cog(), wp, g.wrow(), g.cog() * g.wrow(), 0, don,
                     g.ohw(), g.cog() * g.ohw(), 0, dcol.data<A>(), g.ohw(), g.wrow() * g.ohw(), 0, A(0)},
                    g.groups, 1, Images::separate);
      A* dxn;  // dx[n] (Cin, H*W) in the compute type
      if constexpr (low) dxn = dxbuf.data<A>();
      else dxn = dx.data<T>() + n * g.Cin * g.hw();
      col2im(g, dcol.data<A>(), dxn);
      if constexpr (low) convert_n(dxn, dx.data<T>() + n * g.Cin * g.hw(), g.Cin * g.hw());
    }
  }
  if constexpr (low) {
    if (need_dw) convert_n(dwp, dw.data<T>(), dw.numel());
  }
}

// dout: (N, Cout, OH, OW) contiguous -> db: (Cout). One thread per channel, images in order.
template <class T>
void bias_grad(const Tensor& dout, const Tensor& db) {
  using A = compute_t<T>;
  const int64_t N = dout.size(0), C = dout.size(1), hw = dout.size(2) * dout.size(3);
  const T* d = dout.data<T>();
  T* o = db.data<T>();
  parallel_for(0, C, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, N * hw)), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      // Eight running sums (lane i % 8), added up at the end: a fixed order that vectorises.
      A part[8] = {};
      A tail = 0;
      for (int64_t n = 0; n < N; ++n) {
        const T* p = d + (n * C + c) * hw;
        int64_t i = 0;
        for (; i + 8 <= hw; i += 8)
          for (int j = 0; j < 8; ++j) part[j] += A(p[i + j]);
        for (; i < hw; ++i) tail += A(p[i]);
      }
      A acc = tail;
      for (int j = 0; j < 8; ++j) acc += part[j];
      o[c] = T(acc);
    }
  });
}

// One pass's FLOPs (forward, or each of dx and dW): 2 per multiply-add. Reported as direct work
// (depthwise) or as a convolution of x's dtype (flop_kind): 16-bit ones stage through f32
// (ops/f32_staging.h), which their kind's calibrated rate includes.
FlopKind flop_kind(const ConvGeom& g, DType dtype) { return is_depthwise(g) ? FlopKind::direct : conv_kind(dtype); }

double conv_flops(const ConvGeom& g) {
  return 2.0 * double(g.N) * double(g.Cout) * double(g.OH) * double(g.OW) * double(g.Cin / g.groups) * double(g.KH) *
         double(g.KW);
}

// A contiguous, autograd-free version of t (a workspace copy only when t is a strided view).
Tensor dense(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t.defined() ? t.detach() : t;
  MemoryCategoryGuard cat(MemoryCategory::workspace);
  return contiguous(t.detach());
}

class Conv2dBackward : public Node {
 public:
  Conv2dBackward(Conv2dParams p, Shape x_shape, Shape w_shape, bool has_bias)
      : p_(p), x_shape_(std::move(x_shape)), w_shape_(std::move(w_shape)), has_bias_(has_bias) {}
  std::string_view name() const override { return "Conv2dBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    OpNameGuard op("conv2d_backward");
    Tensor dout = dense(grads[0]);  // (N, Cout, OH, OW)
    const TensorOptions opt{.dtype = dout.dtype(), .device = dout.device()};
    const bool need_dx = needs_input_grad(0), need_dw = needs_input_grad(1);
    Tensor xv = need_dw ? dense(x.unpack()) : Tensor();
    Tensor wv = need_dx ? dense(weight.unpack()) : Tensor();
    Tensor dx = need_dx ? empty(x_shape_, opt) : Tensor();
    Tensor dw = need_dw ? empty(w_shape_, opt) : Tensor();
    ConvGeom g = make_geom(x_shape_, w_shape_, p_);
    count_flops(flop_kind(g, dout.dtype()), conv_flops(g) * (int(need_dx) + int(need_dw)));
    if (dout.device().is_cuda()) {
      Tensor db = has_bias_ && needs_input_grad(2) ? empty({g.Cout}, opt) : Tensor();
      cuda::conv2d_backward(cuda_geom(g), xv, wv, dout, dx, dw, db);
      return {dx, dw, db};
    }
    if (need_dx || need_dw) {
      if (is_depthwise(g)) {
        detail::depthwise_conv2d_backward(xv, wv, dout, dx, dw, p_.stride, p_.padding);
      } else {
        MG_DISPATCH_FLOAT(dout.dtype(), "conv2d_backward",
                          [&] { conv2d_backward_gemm<scalar_t>(g, xv, wv, dout, dx, dw); });
      }
    }
    Tensor db;
    if (has_bias_ && needs_input_grad(2)) {
      db = empty({g.Cout}, opt);
      if (!dout.is_meta()) MG_DISPATCH_FLOAT(dout.dtype(), "conv2d_backward", [&] { bias_grad<scalar_t>(dout, db); });
    }
    return {dx, dw, db};
  }
  SavedTensor x{this}, weight{this};

 private:
  Conv2dParams p_;
  Shape x_shape_, w_shape_;
  bool has_bias_;
};

void check_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  const char* op = "conv2d";
  check_defined(op, x, "input");
  check_defined(op, w, "weight");
  check_same_device(op, x, w);
  check_same_dtype(op, x, w);
  check_floating(op, x);
  check_dim(op, x, 4, "input (N, Cin, H, W)");
  check_dim(op, w, 4, "weight (Cout, Cin/groups, KH, KW)");
  MG_CHECK(p.stride >= 1 && p.padding >= 0 && p.groups >= 1, op, ": invalid parameters stride ", p.stride,
           ", padding ", p.padding, ", groups ", p.groups, " (need stride >= 1, padding >= 0, groups >= 1)");
  const int64_t cin = x.size(1), cout = w.size(0);
  MG_CHECK(cin % p.groups == 0, op, ": input channels ", cin, " are not divisible by groups ", p.groups, " (input ",
           x.shape(), ", weight ", w.shape(), ")");
  MG_CHECK(cout % p.groups == 0, op, ": output channels ", cout, " are not divisible by groups ", p.groups,
           " (weight ", w.shape(), ")");
  MG_CHECK(w.size(1) * p.groups == cin, op, ": weight ", w.shape(), " with groups ", p.groups, " expects ",
           w.size(1) * p.groups, " input channels, but the input ", x.shape(), " has ", cin);
  MG_CHECK(w.size(2) >= 1 && w.size(3) >= 1, op, ": empty kernel in weight ", w.shape());
  const int64_t oh = out_size(x.size(2), w.size(2), p.stride, p.padding);
  const int64_t ow = out_size(x.size(3), w.size(3), p.stride, p.padding);
  MG_CHECK(oh > 0 && ow > 0, op, ": output size ", oh, "x", ow, " is not positive: input ", x.shape(), ", weight ",
           w.shape(), ", stride ", p.stride, ", padding ", p.padding, "\n  hint: the padded input must be at least the kernel size");
  if (b.defined()) {
    check_same_device(op, x, b);
    check_same_dtype(op, x, b);
    MG_CHECK(b.dim() == 1 && b.size(0) == cout, op, ": bias must have shape ", Shape{cout}, " for weight ", w.shape(),
             ", got ", b.shape());
  }
}

}  // namespace

// x: (N, Cin, H, W), weight: (Cout, Cin/groups, KH, KW), bias: (Cout) -> (N, Cout, OH, OW)
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dParams p) {
  if (autocast_wants_low({x, weight, bias})) return conv2d(autocast_low(x), autocast_low(weight), autocast_low(bias), p);
  check_conv2d(x, weight, bias, p);
  OpNameGuard name("conv2d");
  ConvGeom g = make_geom(x.shape(), weight.shape(), p);
  count_flops(flop_kind(g, x.dtype()), conv_flops(g));
  Tensor out = empty({g.N, g.Cout, g.OH, g.OW}, {.dtype = x.dtype(), .device = x.device()});
  Tensor xc = dense(x), wc = dense(weight), bc = dense(bias);
  if (x.device().is_cuda()) cuda::conv2d_forward(cuda_geom(g), xc, wc, bc, out);
  else if (is_depthwise(g)) {
    detail::depthwise_conv2d_forward(xc, wc, bc, out, p.stride, p.padding);
  } else {
    MG_DISPATCH_FLOAT(x.dtype(), "conv2d", [&] { conv2d_forward_gemm<scalar_t>(g, xc, wc, bc, out); });
  }
  if (auto node = make_node_if_needed<Conv2dBackward>({x, weight, bias}, p, x.shape(), weight.shape(), bias.defined())) {
    set_history(node, {x, weight, bias}, {out});
    if (node->needs_input_grad(1)) node->x.save(x);       // dW needs the columns of x
    if (node->needs_input_grad(0)) node->weight.save(weight);  // dx needs W
  }
  return out;
}

}  // namespace mg
