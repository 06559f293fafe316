// Channel-vectorised depthwise convolution (multiplier 1): L channels of one image are moved
// into a stack tile laid out (position, lane), so a vector of L lanes holds one pixel of L
// channels, and every lane runs one fixed operation sequence on its own channel, so the result has
// the same bits at any lane count. L = 16 is one AVX-512 register, L = 8 one AVX2 register (GCC
// vector extensions; the compiler emits the build's ISA), L = 1 the scalar path.
// - Output and dx: each lane repeats the plane-by-plane reference (ops/conv2d_depthwise.cpp)
//   exactly, the same fused multiply-adds in the same tap order, so they have the reference's
//   bits, while MobileNetV2's small planes (16x16, 8x8, 4x4, where the reference's row loops are
//   4 to 16 long) run at full vector width. Tiles: up to kTileFloats per tile, on the stack
//   (16 KiB), so larger planes take the reference.
// - dW: per image, each tap's sum over the output pixels in raster order (oh, then ow), one f32
//   sum per lane starting from 0, added to dW after the previous images' sums. The reference sums
//   each row in eight partial sums that GCC compiles as a mix of fused and unfused multiply-adds,
//   so no other code reproduces its bits; this order is defined by the code and is the same at
//   every lane count (tests compare it with the reference within a bound). The input and dout
//   are tiled in strips of output rows (the input rows they read), so planes up to 85 columns wide
//   fit (MobileNetV2-32's 32x32 planes among them): a strip continues the raster order.
#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "ops/conv2d_depthwise.h"

namespace mg::detail {
namespace {

constexpr int64_t kTileFloats = 4096;   // one (plane, lanes) tile
constexpr int64_t kMaxTaps = 49;        // up to 7x7 kernels

template <int L>
struct VecOf;
template <>
struct VecOf<16> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<1> {
  using type = float;
};

template <int L>
using Vec = typename VecOf<L>::type;

template <int L>
Vec<L> load(const float* p) {
  Vec<L> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <int L>
void store(float* p, Vec<L> v) {
  std::memcpy(p, &v, sizeof(v));
}

// dst (P, L) from `lanes` planes of P values, plane l at src + l * plane_stride; lanes past
// `lanes` are zero (a channel block at the end of C).
template <int L>
void to_lanes(const float* src, int64_t plane_stride, int64_t lanes, int64_t P, float* dst) {
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t p = 0; p < P; ++p) dst[p * L + l] = src[l * plane_stride + p];
  for (int64_t l = lanes; l < L; ++l)
    for (int64_t p = 0; p < P; ++p) dst[p * L + l] = 0.0f;
}

// The first `lanes` lanes of src (P, L) back into planes of P values.
template <int L>
void from_lanes(const float* src, int64_t lanes, int64_t P, float* dst, int64_t plane_stride) {
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t p = 0; p < P; ++p) dst[l * plane_stride + p] = src[p * L + l];
}

// ot (OH*OW, L) = bt + sum over taps in (kh, kw) order of wt[tap] * xt at the tap's input.
template <int L>
void tile_forward(const DwGeom& g, const float* xt, const float* wt, const float* bt, float* ot) {
  for (int64_t oh = 0; oh < g.OH; ++oh)
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      Vec<L> acc = load<L>(bt);
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.stride - g.pad + kh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = ow * g.stride - g.pad + kw;
          if (iw < 0 || iw >= g.W) continue;
          acc = load<L>(wt + (kh * g.KW + kw) * L) * load<L>(xt + (ih * g.W + iw) * L) + acc;
        }
      }
      store<L>(ot + (oh * g.OW + ow) * L, acc);
    }
}

// dxt (H*W, L): each input pixel gathers wt[tap] * dt over the outputs that read it, in (kh, kw)
// order, starting from 0: the order in which the reference scatters into it.
template <int L>
void tile_backward_input(const DwGeom& g, const float* dt, const float* wt, float* dxt) {
  for (int64_t ih = 0; ih < g.H; ++ih)
    for (int64_t iw = 0; iw < g.W; ++iw) {
      Vec<L> acc{};  // +0, as the reference's zero-filled dx
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t th = ih + g.pad - kh;  // = oh * stride
        if (th < 0 || th % g.stride != 0 || th / g.stride >= g.OH) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t tw = iw + g.pad - kw;
          if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.OW) continue;
          acc = load<L>(wt + (kh * g.KW + kw) * L) * load<L>(dt + (th / g.stride * g.OW + tw / g.stride) * L) + acc;
        }
      }
      store<L>(dxt + (ih * g.W + iw) * L, acc);
    }
}

// Per-channel weights (Cout, KK) of channels [c0, c0 + lanes) as (KK, L), and the bias as (L).
template <int L>
void params_to_lanes(const DwGeom& g, const float* w, const float* bias, int64_t c0, int64_t lanes, float* wt,
                     float* bt) {
  to_lanes<L>(w + c0 * g.kk(), g.kk(), lanes, g.kk(), wt);
  for (int64_t l = 0; l < L; ++l) bt[l] = l < lanes && bias ? bias[c0 + l] : 0.0f;
}

int64_t blocks_of(const DwGeom& g, int L) { return (g.Cout + L - 1) / L; }

template <int L>
void forward_lanes(const DwGeom& g, int64_t count, const float* xs, const float* w, const float* bias, float* os) {
  const int64_t blocks = blocks_of(g, L);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, g.kk() * g.ohw() * L));
  parallel_for(0, count * blocks, grain, [&](int64_t tb, int64_t te) {
    alignas(64) float xt[kTileFloats], ot[kTileFloats], wt[kMaxTaps * L], bt[L] = {};
    int64_t loaded = -1;  // the channel block whose parameters are in wt, bt
    for (int64_t t = tb; t < te; ++t) {
      const int64_t n = t / blocks, b = t % blocks, c0 = b * L, lanes = std::min<int64_t>(L, g.Cout - c0);
      if (b != loaded) params_to_lanes<L>(g, w, bias, c0, lanes, wt, bt), loaded = b;
      to_lanes<L>(xs + (n * g.Cin + c0) * g.hw(), g.hw(), lanes, g.hw(), xt);
      tile_forward<L>(g, xt, wt, bt, ot);
      from_lanes<L>(ot, lanes, g.ohw(), os + (n * g.Cout + c0) * g.ohw(), g.ohw());
    }
  });
}

template <int L>
void backward_input_lanes(const DwGeom& g, int64_t count, const float* dos, const float* w, float* dxs) {
  const int64_t blocks = blocks_of(g, L);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, g.kk() * g.ohw() * L));
  parallel_for(0, count * blocks, grain, [&](int64_t tb, int64_t te) {
    alignas(64) float dt[kTileFloats], dxt[kTileFloats], wt[kMaxTaps * L], bt[L] = {};
    int64_t loaded = -1;  // the channel block whose weights are in wt
    for (int64_t t = tb; t < te; ++t) {
      const int64_t n = t / blocks, b = t % blocks, c0 = b * L, lanes = std::min<int64_t>(L, g.Cout - c0);
      if (b != loaded) params_to_lanes<L>(g, w, nullptr, c0, lanes, wt, bt), loaded = b;
      to_lanes<L>(dos + (n * g.Cout + c0) * g.ohw(), g.ohw(), lanes, g.ohw(), dt);
      tile_backward_input<L>(g, dt, wt, dxt);
      from_lanes<L>(dxt, lanes, g.hw(), dxs + (n * g.Cin + c0) * g.hw(), g.hw());
    }
  });
}

template <int L>
float lane_of(Vec<L> v, int64_t l) {
  if constexpr (L == 1) return v;
  else return v[l];
}

// Output rows per strip of the weight gradient's tiles: the strip's dout (rows, OW, L) and the
// input rows it reads (rows', W, L) each fit a tile; 0 if not even one row does.
int64_t weight_strip_rows(const DwGeom& g, int L) {
  auto input_rows = [&](int64_t r) { return std::min(g.H, (r - 1) * g.stride + g.KH); };
  if (g.OW * L > kTileFloats || input_rows(1) * g.W * L > kTileFloats) return 0;
  int64_t r = std::min(g.OH, kTileFloats / (g.OW * L));
  while (r > 1 && input_rows(r) * g.W * L > kTileFloats) --r;
  return r;
}

// acc[tap] (L) += dt * xt at the tap's input for the output rows [oh0, oh1), in raster order;
// dt holds those rows (OW, L each), xt the input rows from ih0 (W, L each).
template <int L>
void tile_backward_weight(const DwGeom& g, int64_t oh0, int64_t oh1, int64_t ih0, const float* dt,
                          const float* xt, Vec<L>* acc) {
  for (int64_t oh = oh0; oh < oh1; ++oh)
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const Vec<L> d = load<L>(dt + ((oh - oh0) * g.OW + ow) * L);
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.stride - g.pad + kh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = ow * g.stride - g.pad + kw;
          if (iw < 0 || iw >= g.W) continue;
          Vec<L>& a = acc[kh * g.KW + kw];
          a = d * load<L>(xt + ((ih - ih0) * g.W + iw) * L) + a;
        }
      }
    }
}

// dw (Cout, KK) += the weight gradient of `count` images: one task per channel block, images in
// order.
template <int L>
void backward_weight_lanes(const DwGeom& g, int64_t count, const float* dos, const float* xs,
                           float* dw) {
  const int64_t blocks = blocks_of(g, L), rows = weight_strip_rows(g, L);
  const int64_t work = std::max<int64_t>(1, count * g.kk() * g.ohw() * L);
  const int64_t grain = std::max<int64_t>(1, 32768 / work);
  parallel_for(0, blocks, grain, [&](int64_t bb, int64_t be) {
    alignas(64) float xt[kTileFloats], dt[kTileFloats];
    Vec<L> acc[kMaxTaps];
    for (int64_t b = bb; b < be; ++b) {
      const int64_t c0 = b * L, lanes = std::min<int64_t>(L, g.Cout - c0);
      for (int64_t n = 0; n < count; ++n) {
        for (int64_t t = 0; t < g.kk(); ++t) acc[t] = Vec<L>{};
        for (int64_t oh0 = 0; oh0 < g.OH; oh0 += rows) {
          const int64_t oh1 = std::min(g.OH, oh0 + rows);
          const int64_t ih0 = std::max<int64_t>(0, oh0 * g.stride - g.pad);
          const int64_t ih1 = std::min(g.H, (oh1 - 1) * g.stride - g.pad + g.KH);
          const float* x = xs + (n * g.Cin + c0) * g.hw() + ih0 * g.W;
          const float* d = dos + (n * g.Cout + c0) * g.ohw() + oh0 * g.OW;
          if (ih1 > ih0) to_lanes<L>(x, g.hw(), lanes, (ih1 - ih0) * g.W, xt);
          to_lanes<L>(d, g.ohw(), lanes, (oh1 - oh0) * g.OW, dt);
          tile_backward_weight<L>(g, oh0, oh1, ih0, dt, xt, acc);
        }
        for (int64_t l = 0; l < lanes; ++l)
          for (int64_t t = 0; t < g.kk(); ++t) dw[(c0 + l) * g.kk() + t] += lane_of<L>(acc[t], l);
      }
    }
  });
}

}  // namespace

bool depthwise_lanes(const DwGeom& g, int lanes) {
  return g.mult == 1 && g.kk() <= kMaxTaps && std::max(g.hw(), g.ohw()) * lanes <= kTileFloats;
}

void depthwise_lanes_forward(const DwGeom& g, int lanes, int64_t count, const float* xs, const float* w,
                             const float* bias, float* os) {
  if (lanes == 16) forward_lanes<16>(g, count, xs, w, bias, os);
  else if (lanes == 8) forward_lanes<8>(g, count, xs, w, bias, os);
  else forward_lanes<1>(g, count, xs, w, bias, os);
}

void depthwise_lanes_backward_input(const DwGeom& g, int lanes, int64_t count, const float* dos, const float* w,
                                    float* dxs) {
  if (lanes == 16) backward_input_lanes<16>(g, count, dos, w, dxs);
  else if (lanes == 8) backward_input_lanes<8>(g, count, dos, w, dxs);
  else backward_input_lanes<1>(g, count, dos, w, dxs);
}

bool depthwise_lanes_weight(const DwGeom& g, int lanes) {
  return g.mult == 1 && g.kk() <= kMaxTaps && weight_strip_rows(g, lanes) > 0;
}

void depthwise_lanes_backward_weight(const DwGeom& g, int lanes, int64_t count, const float* dos,
                                     const float* xs, float* dw) {
  if (lanes == 16) backward_weight_lanes<16>(g, count, dos, xs, dw);
  else if (lanes == 8) backward_weight_lanes<8>(g, count, dos, xs, dw);
  else backward_weight_lanes<1>(g, count, dos, xs, dw);
}

}  // namespace mg::detail
