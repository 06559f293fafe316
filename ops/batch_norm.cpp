// batch_norm over (N, C, H, W) or (N, C): per channel c, y = (x - mean_c) * rstd_c * w_c + b_c.
// Training normalises with the batch's statistics (biased variance) and, under no_grad, moves
// running_mean/var towards them (unbiased variance, PyTorch's momentum); eval uses the running
// statistics. x is viewed as (N, C, S), S = H * W; each channel is reduced by one thread in a
// fixed order (vectorised f32 partial sums added into f64, Note [Batch norm sums]), so results
// do not depend on the thread count. Mixed precision: an f16/bf16 x may come with f32 weight and
// bias (what autocast passes); it is computed in f32 and y and dx keep x's dtype, dweight and
// dbias the parameters'.
//
// What BatchNormBackward saves: x plus mean and rstd (C each), and weight when dx is needed. As in
// layer_norm, x-hat would be a fresh (N, C, H, W) tensor, while x is the caller's own (at worst C
// floats more than x-hat + rstd); the (C) statistics are copies, so later in-place updates of the
// running buffers cannot reach backward. On cuda:N the same steps are ops/cuda/batch_norm.cu.
//
// batch_norm_relu6 is relu6(batch_norm(x)) in one op (MobileNetV2's BN + ReLU6), in the spirit
// of in-place activated batch norm (Rota Bulo et al. 2018): the separate op pair saves x for the
// batch norm and the (N, C, H, W) batch norm output for the ReLU6; the fused op saves x alone (plus
// bias, C values) and its backward recomputes which outputs the clamp cut, z = x * scale + shift
// by the forward's own formula, so it masks exactly the same gradients. (A clamp cannot be
// inverted from its output, so keeping only the output, as the paper does for leaky ReLU, would
// lose the x-hat that the statistics' gradient needs at clipped positions.) The output is the
// pair's bit for bit, and so are the gradients.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "core/flop_counter.h"
#include "core/parallel.h"
#include "ops/autocast_policy.h"
#include "ops/cpu_loops.h"
#include "ops/cuda/launchers.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// The affine parameters' dtype: x's own, or f32 for an f16/bf16 x (mixed, as under autocast).
// Calls f with a P* null pointer typed as that dtype.
template <class T, class F>
void dispatch_param(DType pd, F f) {
  if (pd == dtype_of_v<T>) f(static_cast<T*>(nullptr));
  else f(static_cast<float*>(nullptr));
}

Tensor contiguous_scratch(const Tensor& t) {
  if (t.is_contiguous()) return t.detach();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return contiguous(t.detach());
}

bool wants_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

// x as (N, C, S).
struct ChannelLayout {
  int64_t N, C, S;
  int64_t count() const { return N * S; }  // values per channel
};

ChannelLayout channel_layout(const Tensor& x) {
  int64_t S = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  return {x.size(0), x.size(1), S};
}

// Calls f(c) for every channel, parallel over channels.
template <class F>
void for_channels(const ChannelLayout& l, F f) {
  parallel_for(0, l.C, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, l.count())), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(c);
  });
}

// Note [Batch norm sums]: a channel is walked plane by plane (n = 0, 1, ...) in blocks of
// kBlock values; 16-bit blocks are converted to f32 on the stack first (detail::load_block of
// ops/cpu_loops.h, as the element-wise loops do). f32 sums run in 16 lanes (value i of a block
// goes to lane i % 16; a block's tail fills the first lanes): within a block each lane sums in
// f32 (at most kBlock / 16 additions), then every lane is added into its own f64 running sum, and
// the channel's total adds the 16 f64 lanes in lane order. The lanes are GCC vector extensions of
// 16 floats (one AVX-512 register, two AVX2 registers, or scalar code), so the bits are the same
// on every ISA and thread count. f64, the reference dtype of the PyTorch and gradcheck tests,
// keeps one running sum in plain order.
constexpr int64_t kBlock = detail::kBlock;  // 256, the element-wise loops' block (ops/cpu_loops.h)

typedef float F16 __attribute__((vector_size(64)));  // 16 f32 lanes
typedef float F8 __attribute__((vector_size(32)));
typedef double D8 __attribute__((vector_size(64)));  // 8 f64 lanes
constexpr int64_t kLanes = 16;

inline F16 load16(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// The first n < 16 values at p, zeros in the other lanes.
inline F16 load_tail(const float* p, int64_t n) {
  F16 v{};
  std::memcpy(&v, p, size_t(n) * sizeof(float));
  return v;
}
inline void store16(float* p, F16 v) { std::memcpy(p, &v, sizeof(v)); }
inline void store_tail(float* p, int64_t n, F16 v) {
  std::memcpy(p, &v, size_t(n) * sizeof(float));
}
inline F16 splat(float v) { return F16{} + v; }

// Two running sums (e.g. of x and of its centred squares) of one channel: per lane in f64 for f32
// data, one plain sum for f64 data.
template <class S>
struct PairSums {
  double a = 0, b = 0;
  double first() const { return a; }
  double second() const { return b; }
};
template <>
struct PairSums<float> {
  D8 a_lo{}, a_hi{}, b_lo{}, b_hi{};  // lanes 0-7 and 8-15
  void add(F16 a, F16 b) {
    a_lo += half(a, 0), a_hi += half(a, 1), b_lo += half(b, 0), b_hi += half(b, 1);
  }
  double first() const { return total(a_lo, a_hi); }
  double second() const { return total(b_lo, b_hi); }

 private:
  static D8 half(F16 v, int h) {
    F8 f;
    std::memcpy(&f, reinterpret_cast<const float*>(&v) + 8 * h, sizeof(f));
    return __builtin_convertvector(f, D8);
  }
  static double total(D8 lo, D8 hi) {
    double t = 0;
    for (int j = 0; j < 8; ++j) t += lo[j];
    for (int j = 0; j < 8; ++j) t += hi[j];
    return t;
  }
};

// Calls f(offset, n) for the blocks of channel c's values: offsets into an (N, C, S) tensor.
template <class F>
void for_channel_blocks(const ChannelLayout& l, int64_t c, F f) {
  for (int64_t n = 0; n < l.N; ++n)
    for (int64_t s = 0; s < l.S; s += kBlock) f((n * l.C + c) * l.S + s, std::min(kBlock, l.S - s));
}

// Adds the sum of v[i] and of (v[i] - shift)^2 over [0, n) to acc.
inline void block_sums(const double* v, int64_t n, double shift, PairSums<double>& acc) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = v[i] - shift;
    acc.a += v[i];
    acc.b += d * d;
  }
}
inline void block_sums(const float* v, int64_t n, float shift, PairSums<float>& acc) {
  F16 a{}, q{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const F16 x = load16(v + i), d = x - shift;
    a += x;
    q += d * d;
  }
  if (i < n) {
    F16 d{};  // zero in the lanes past the tail
    for (int64_t j = 0; j < n - i; ++j) d[j] = v[i + j] - shift;
    a += load_tail(v + i, n - i);
    q += d * d;
  }
  acc.add(a, q);
}

// Adds the sum of g[i] and of g[i] * (x[i] - shift) over [0, n) to acc.
inline void block_grad_sums(const double* g, const double* x, int64_t n, double shift,
                            PairSums<double>& acc) {
  for (int64_t i = 0; i < n; ++i) {
    acc.a += g[i];
    acc.b += g[i] * (x[i] - shift);
  }
}
inline void block_grad_sums(const float* g, const float* x, int64_t n, float shift,
                            PairSums<float>& acc) {
  F16 a{}, b{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const F16 gv = load16(g + i);
    a += gv;
    b += gv * (load16(x + i) - shift);
  }
  if (i < n) {  // g is zero past the tail, so those lanes add zeros
    const F16 gv = load_tail(g + i, n - i);
    a += gv;
    b += gv * (load_tail(x + i, n - i) - shift);
  }
  acc.add(a, b);
}

// Channel c's affine map: y = x * scale + shift, scale = rstd * w, shift = b - mean * scale.
// The forward and batch_norm_relu6's backward both evaluate it through here (f32: on 16 lanes,
// map16), so the backward's recomputed outputs have the forward's bits.
template <class S>
struct ChannelAffine {
  S scale, shift;
  S operator()(S x) const { return x * scale + shift; }
  F16 map16(F16 x) const { return x * scale + shift; }
};

// The affine parameters as read by the kernels: w and b (C) of dtype P, either may be absent.
template <class P>
struct AffineParams {
  const P* w = nullptr;
  const P* b = nullptr;
  int64_t ws = 0, bs = 0;
  AffineParams(const Tensor& weight, const Tensor& bias) {
    if (weight.defined()) w = weight.data<P>(), ws = weight.stride(0);
    if (bias.defined()) b = bias.data<P>(), bs = bias.stride(0);
  }
  template <class S>
  ChannelAffine<S> channel(int64_t c, S mean, S rstd) const {
    const S scale = rstd * (w ? S(compute_t<P>(w[c * ws])) : S(1));
    return {scale, (b ? S(compute_t<P>(b[c * bs])) : S(0)) - mean * scale};
  }
};

// o[i] = f(i-th 16 lanes) for [0, n) of f32 data: full vectors, then the tail's lanes.
template <class F>
void map_lanes(float* o, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store16(o + i, f(i, kLanes));
  if (i < n) store_tail(o + i, n - i, f(i, n - i));
}
// The m values at p + i as 16 lanes (zeros past m).
inline F16 lanes_at(const float* p, int64_t i, int64_t m) {
  return m == kLanes ? load16(p + i) : load_tail(p + i, m);
}

// relu6 on 16 lanes, as fn::Relu6 (NaN passes through).
inline F16 relu6_16(F16 z) {
  const F16 zero{}, six = splat(6.0f);
  return z < zero ? zero : (z > six ? six : z);
}

// One block of y = affine(xv) (clamped to [0, 6] with Relu6), stored as T.
template <class T, bool Relu6, class S>
void normalize_block(const S* xv, int64_t n, const ChannelAffine<S>& affine, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    map_lanes(y, n, [&](int64_t i, int64_t m) {
      const F16 z = affine.map16(lanes_at(xv, i, m));
      if constexpr (Relu6) return relu6_16(z);
      else return z;
    });
  } else {
    detail::store_block(y, n, [&](int64_t i) {
      // relu6 of the rounded output equals the rounded relu6: 0 and 6 are exact in every dtype.
      if constexpr (Relu6) return fn::Relu6{}(affine(xv[i]));
      else return affine(xv[i]);
    });
  }
}

// y = x * scale + shift per channel (then clamped to [0, 6] with Relu6), parallel over the
// N * C planes of S values: eval's forward. T: x and y; P: w and b (T, or f32 for a 16-bit T).
template <class T, class P, bool Relu6>
void normalize_kernel(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                      const Tensor& b, const ChannelLayout& l) {
  using S = stat_t<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const S *pm = mean.data<S>(), *pr = rstd.data<S>();
  const AffineParams<P> params(w, b);
  parallel_for(0, l.N * l.C, std::max<int64_t>(1, 16384 / l.S), [&](int64_t pb_, int64_t pe) {
    S xbuf[kBlock];
    for (int64_t plane = pb_; plane < pe; ++plane) {
      const int64_t c = plane % l.C;
      const ChannelAffine<S> affine = params.channel(c, pm[c], pr[c]);
      for (int64_t s = 0; s < l.S; s += kBlock) {
        const int64_t n = std::min(kBlock, l.S - s);
        const S* xv = detail::load_block(px + plane * l.S + s, 1, n, xbuf);
        normalize_block<T, Relu6>(xv, n, affine, py + plane * l.S + s);
      }
    }
  });
}

// Training forward, one channel at a time: the batch statistics mean and biased var (C, f64) in
// two passes (the mean, then the squares centred on it: var = E[(x - m')^2] - (m - m')^2 with m'
// the mean rounded to S), then mean / rstd (C, S) and y = x * scale + shift (clamped to [0, 6]
// with Relu6) over the same channel while its values are still in cache: x is read from memory
// once, not twice.
template <class T, class P, bool Relu6>
void train_normalize_kernel(double* bm, double* bv, const Tensor& y, const Tensor& x,
                            const Tensor& mean, const Tensor& rstd, const Tensor& w,
                            const Tensor& b, const ChannelLayout& l, double eps) {
  using S = stat_t<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  S *pm = mean.data<S>(), *pr = rstd.data<S>();
  const AffineParams<P> params(w, b);
  for_channels(l, [&](int64_t c) {
    S buf[kBlock];
    PairSums<S> sums;
    for_channel_blocks(l, c, [&](int64_t o, int64_t n) {
      block_sums(detail::load_block(px + o, 1, n, buf), n, S(0), sums);
    });
    const double m = sums.first() / double(l.count());
    const S ms = S(m);
    PairSums<S> centred;
    for_channel_blocks(l, c, [&](int64_t o, int64_t n) {
      block_sums(detail::load_block(px + o, 1, n, buf), n, ms, centred);
    });
    const double off = m - double(ms);
    bm[c] = m, bv[c] = std::max(0.0, centred.second() / double(l.count()) - off * off);
    pm[c] = S(bm[c]), pr[c] = S(1.0 / std::sqrt(bv[c] + eps));
    const ChannelAffine<S> affine = params.channel(c, pm[c], pr[c]);
    for_channel_blocks(l, c, [&](int64_t o, int64_t n) {
      normalize_block<T, Relu6>(detail::load_block(px + o, 1, n, buf), n, affine, py + o);
    });
  });
}

// g with the gradients of clamped outputs zeroed (what ReLU6's backward passes to batch norm's),
// for one block of channel c: z is recomputed as the forward stored it (rounded to T), then masked.
template <class T, class S>
const S* relu6_masked_block(const S* g, const S* xv, int64_t n, const ChannelAffine<S>& affine, S* out) {
  if constexpr (std::is_same_v<T, float>) {
    map_lanes(out, n, [&](int64_t i, int64_t m) {
      const F16 z = affine.map16(lanes_at(xv, i, m)), zero{};
      return (z > zero) & (z < splat(6.0f)) ? lanes_at(g, i, m) : zero;
    });
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const S z = S(compute_t<T>(T(affine(xv[i]))));
      out[i] = fn::Relu6Backward{}(g[i], z);
    }
  }
  return out;
}

// Per channel: sum dy (-> dbias) and sum dy * xhat (-> dweight); then dx. Training backward
// also carries the gradient through the batch statistics; eval's statistics are constants.
// T: dy, x and dx; P: w, dw and db. With Relu6 (batch_norm_relu6), dy is the gradient of the
// clamped output and b the bias: dy is masked where the recomputed output was clamped.
template <class T, class P, bool Relu6>
void batch_norm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                                const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                const Tensor& b, const ChannelLayout& l, bool training) {
  using S = stat_t<T>;
  const T *pdy = dy.data<T>(), *px = x.data<T>();
  const S *pm = mean.data<S>(), *pr = rstd.data<S>();
  const P* pw = w.defined() ? w.data<P>() : nullptr;
  int64_t wst = w.defined() ? w.stride(0) : 0;
  const AffineParams<P> params(w, b);
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  P* pdw = dw.defined() ? dw.data<P>() : nullptr;
  P* pdb = db.defined() ? db.data<P>() : nullptr;
  for_channels(l, [&](int64_t c) {
    S gbuf[kBlock], xbuf[kBlock], mbuf[kBlock];
    const S m = pm[c], r = pr[c];
    const ChannelAffine<S> affine = params.channel(c, m, r);
    // dy's block o of n values, masked for Relu6; xv: x's same block.
    auto grad_block = [&](int64_t o, int64_t n, const S* xv) {
      const S* g = detail::load_block(pdy + o, 1, n, gbuf);
      if constexpr (Relu6) return relu6_masked_block<T>(g, xv, n, affine, mbuf);
      else return g;
    };
    PairSums<S> sums;  // sum dy, sum dy * (x - mean)
    for_channel_blocks(l, c, [&](int64_t o, int64_t n) {
      const S* xv = detail::load_block(px + o, 1, n, xbuf);
      block_grad_sums(grad_block(o, n, xv), xv, n, m, sums);
    });
    const double sdy = sums.first(), sdyh = sums.second() * double(r);  // sum dy, sum dy * xhat
    if (pdw) pdw[c] = P(S(sdyh));
    if (pdb) pdb[c] = P(S(sdy));
    if (!pdx) return;
    // training: dx = w * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)); eval: dx = w * rstd * dy.
    // (Evaluated in this order, as PyTorch does: with few values per channel dx is mostly
    // cancellation, e.g. exactly 0 for 2 values.)
    const S k = S(double(r) * (pw ? double(compute_t<P>(pw[c * wst])) : 1.0));
    const S a = training ? S(sdy / double(l.count())) : S(0);
    const S bh = training ? S(sdyh / double(l.count())) : S(0);
    for_channel_blocks(l, c, [&](int64_t o, int64_t n) {
      const S* xv = detail::load_block(px + o, 1, n, xbuf);
      const S* g = grad_block(o, n, xv);
      if constexpr (std::is_same_v<T, float>) {
        map_lanes(pdx + o, n, [&](int64_t i, int64_t mm) {
          return k * (lanes_at(g, i, mm) - a - (lanes_at(xv, i, mm) - m) * r * bh);
        });
      } else {
        detail::store_block(pdx + o, n,
                            [&](int64_t i) { return k * (g[i] - a - (xv[i] - m) * r * bh); });
      }
    });
  });
}

class BatchNormBackward : public Node {
 public:
  BatchNormBackward(bool training, DType param_dtype, bool relu6)
      : training_(training), param_dtype_(param_dtype), relu6_(relu6) {}
  std::string_view name() const override { return relu6_ ? "BatchNormReLU6Backward" : "BatchNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    bool need_dx = needs_input_grad(0), need_dw = needs_input_grad(1), need_db = needs_input_grad(2);
    int64_t C = g[0].size(1);
    std::vector<int64_t> not_channel = g[0].dim() == 4 ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0};
    if (!need_dx && !need_dw && !relu6_) {  // dbias only, summed in the bias's dtype
      Tensor dy = g[0].dtype() == param_dtype_ ? g[0] : cast(g[0], param_dtype_);
      return {Tensor(), Tensor(), sum(dy, not_channel)};
    }
    Tensor dy = contiguous_scratch(g[0]);
    TensorOptions opt{.dtype = dy.dtype(), .device = dy.device()};
    TensorOptions popt{.dtype = param_dtype_, .device = dy.device()};
    Tensor dx = need_dx ? empty(dy.shape(), opt) : Tensor();
    Tensor dw = need_dw ? empty({C}, popt) : Tensor();
    Tensor db = need_db ? empty({C}, popt) : Tensor();
    if (C == 0) return {dx, dw, db};
    if (dy.numel() == 0) {  // eval on an empty batch: no contributions
      if (dw.defined() && !dw.is_meta()) fill_(dw, 0.0);
      if (db.defined() && !db.is_meta()) fill_(db, 0.0);
      return {dx, dw, db};
    }
    Tensor xv = contiguous_scratch(x.unpack()), mv = mean.unpack(), rv = rstd.unpack();  // on meta too: exact bytes
    Tensor wv = weight.defined() ? weight.unpack() : Tensor();
    Tensor bv = bias.defined() ? bias.unpack() : Tensor();
    if (training_) count_flops(FlopKind::batch_norm, double(dy.numel()));
    if (dy.is_meta()) return {dx, dw, db};
    ChannelLayout l = channel_layout(xv);
    if (dy.device().is_cuda()) {
      if (relu6_) {  // the clamp's mask from the recomputed output, in a workspace buffer
        MemoryCategoryGuard ws(MemoryCategory::workspace);
        Tensor masked = empty(dy.shape(), opt);
        cuda::batch_norm_normalize(masked, xv, mv, rv, wv, bv, l.N, l.C, l.S);
        cuda::binary(cuda::BinaryOp::relu6_backward, masked, dy, masked);
        dy = masked;
      }
      cuda::batch_norm_backward(dx, dw, db, dy, xv, mv, rv, wv, l.N, l.C, l.S, training_);
      return {dx, dw, db};
    }
    MG_DISPATCH_FLOAT(dy.dtype(), "batch_norm backward", [&] {
      using T = scalar_t;
      dispatch_param<T>(param_dtype_, [&](auto* p) {
        using P = std::remove_pointer_t<decltype(p)>;
        if (relu6_) batch_norm_backward_kernel<T, P, true>(dx, dw, db, dy, xv, mv, rv, wv, bv, l, training_);
        else batch_norm_backward_kernel<T, P, false>(dx, dw, db, dy, xv, mv, rv, wv, bv, l, training_);
      });
    });
    return {dx, dw, db};
  }
  SavedTensor x{this};       // (N, C, H, W) or (N, C): the input itself
  SavedTensor mean{this};    // (C) the mean used (batch or a copy of running)
  SavedTensor rstd{this};    // (C) 1 / sqrt(var + eps) used
  SavedTensor weight{this};  // (C) when dx is needed (always with relu6) and weight is defined
  SavedTensor bias{this};    // (C) with relu6 only: the recomputed output needs it

 private:
  bool training_;
  DType param_dtype_;  // of weight and bias (and so of their gradients)
  bool relu6_;         // batch_norm_relu6: dy is the clamped output's gradient
};

// weight / bias: (C), on x's device, of x's dtype or f32 when x is f16 / bf16 (mixed precision:
// 16-bit activations, f32 affine parameters, as cuDNN's batch norm does).
void check_affine(const char* op, const Tensor& p, const Tensor& x, const char* what) {
  if (!p.defined()) return;
  check_same_device(op, x, p);
  const bool low_x = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  MG_CHECK(p.dtype() == x.dtype() || (low_x && p.dtype() == DType::f32), op, ": ", what, " must have the input's dtype ",
           x.dtype(), low_x ? " or f32" : "", ", got ", p.dtype());
  MG_CHECK(p.dim() == 1 && p.size(0) == x.size(1), op, ": ", what, " must have shape ", Shape{x.size(1)},
           " for input ", x.shape(), ", got ", p.shape());
}

// running_mean / running_var: (C) on x's device, any floating dtype.
void check_running(const char* op, const Tensor& p, const Tensor& x, const char* what) {
  if (!p.defined()) return;
  check_same_device(op, x, p);
  check_floating(op, p);
  MG_CHECK(p.dim() == 1 && p.size(0) == x.size(1), op, ": ", what, " must have shape ", Shape{x.size(1)},
           " for input ", x.shape(), ", got ", p.shape());
}

// running = (1 - momentum) * running + momentum * batch, elementwise over (C); any float dtype.
void update_running(const Tensor& running, const double* batch, double momentum) {
  MG_DISPATCH_FLOAT(running.dtype(), "batch_norm", [&] {
    scalar_t* p = running.data<scalar_t>();
    int64_t st = running.stride(0);
    for (int64_t c = 0; c < running.size(0); ++c) {
      double old = double(compute_t<scalar_t>(p[c * st]));
      p[c * st] = scalar_t(compute_t<scalar_t>((1.0 - momentum) * old + momentum * batch[c]));
    }
  });
}

// batch_norm, and batch_norm_relu6 with relu6.
Tensor batch_norm_impl(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, bool relu6) {
  // Under autocast the affine parameters are f32 and the input keeps its dtype: a 16-bit input
  // is normalised in f32 and rounded on store (Note [Autocast]), so no cast surrounds the op.
  // The running statistics are buffers updated in place, never replaced by a copy.
  if (autocast_wants_f32({weight, bias}))
    return batch_norm_impl(x, running_mean, running_var, autocast_f32(weight), autocast_f32(bias), training,
                           momentum, eps, relu6);
  const char* op = relu6 ? "batch_norm_relu6" : "batch_norm";
  check_defined(op, x, "input");
  check_floating(op, x);
  MG_CHECK(x.dim() == 2 || x.dim() == 4, op, ": input must be (N, C, H, W) or (N, C), got shape ", x.shape());
  check_affine(op, weight, x, "weight");
  check_affine(op, bias, x, "bias");
  MG_CHECK(!weight.defined() || !bias.defined() || weight.dtype() == bias.dtype(), op,
           ": weight and bias must have one dtype, got ", weight.dtype(), " and ", bias.dtype());
  check_running(op, running_mean, x, "running_mean");
  check_running(op, running_var, x, "running_var");
  MG_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must both be given or both be undefined");
  MG_CHECK(training || running_mean.defined(), op,
           ": eval mode normalises with the running statistics, but running_mean and running_var are undefined"
           "\n  hint: pass training = true to use the batch's statistics");
  ChannelLayout l = channel_layout(x);
  MG_CHECK(!training || l.count() > 1, op, ": training needs more than 1 value per channel, got input ", x.shape());
  OpNameGuard name(op);
  if (training) count_flops(FlopKind::batch_norm, double(x.numel()));  // its passes (flop_counter.h)
  bool record = any_requires_grad({x, weight, bias});
  // With relu6 every gradient, dbias's too, needs the clamp's mask, so x is always kept.
  bool keep_x = record && (relu6 || wants_grad(x) || wants_grad(weight));
  DType sd = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const DType param_dtype = weight.defined() ? weight.dtype() : bias.defined() ? bias.dtype() : x.dtype();
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});  // like x
  Tensor mean, rstd;                                                        // (C) each
  {
    MemoryCategoryGuard cat(keep_x ? current_memory_category() : MemoryCategory::workspace);
    mean = empty({l.C}, {.dtype = sd, .device = x.device()});
    rstd = empty({l.C}, {.dtype = sd, .device = x.device()});
  }
  bool update = training && running_mean.defined();
  if (l.C > 0) {
    // The scratch is allocated on meta too, so meta sees the kernel's workspace.
    Tensor xc = contiguous_scratch(x);
    Tensor stats;  // (2, C) f64: the mean and the (biased, or running) variance
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);
      stats = empty({2, l.C}, {.dtype = DType::f64, .device = x.device()});
    }
    if (x.is_meta()) {
      // shapes and bytes only
    } else if (x.device().is_cuda()) {
      if (training) {
        cuda::batch_norm_stats(stats, xc, l.N, l.C, l.S);
      } else {
        Tensor s = stats.detach();
        copy_(select(s, 0, 0), running_mean.detach());
        copy_(select(s, 0, 1), running_var.detach());
      }
      const double unbias = update ? double(l.count()) / double(l.count() - 1) : 1.0;
      cuda::batch_norm_finish_stats(mean, rstd, stats, eps, update ? running_mean : Tensor(),
                                    update ? running_var : Tensor(), momentum, unbias);
      cuda::batch_norm_normalize(y, xc, mean, rstd, weight, bias, l.N, l.C, l.S);
      if (relu6) cuda::unary(cuda::UnaryOp::relu6, y, y);  // in place: element i reads and writes i
    } else {
      double *bm = stats.data<double>(), *bv = bm + l.C;
      // Training: statistics and output in one pass over the channels; eval: the running
      // statistics, then the output.
      auto normalize = [&](auto kernel_of) {
        MG_DISPATCH_FLOAT(x.dtype(), op, [&] {
          using T = scalar_t;
          dispatch_param<T>(param_dtype, [&](auto* p) { kernel_of(static_cast<T*>(nullptr), p); });
        });
      };
      if (training) {
        normalize([&](auto* t, auto* p) {
          using T = std::remove_pointer_t<decltype(t)>;
          using P = std::remove_pointer_t<decltype(p)>;
          if (relu6)
            train_normalize_kernel<T, P, true>(bm, bv, y, xc, mean, rstd, weight, bias, l, eps);
          else
            train_normalize_kernel<T, P, false>(bm, bv, y, xc, mean, rstd, weight, bias, l, eps);
        });
      } else {
        Tensor s = stats.detach();
        copy_(select(s, 0, 0), running_mean.detach());
        copy_(select(s, 0, 1), running_var.detach());
        auto store_stats = [&](auto* pm, auto* pr) {
          using S = std::remove_pointer_t<decltype(pm)>;
          for (int64_t c = 0; c < l.C; ++c)
            pm[c] = S(bm[c]), pr[c] = S(1.0 / std::sqrt(bv[c] + eps));
        };
        if (sd == DType::f64) store_stats(mean.data<double>(), rstd.data<double>());
        else store_stats(mean.data<float>(), rstd.data<float>());
        if (x.numel() > 0)
          normalize([&](auto* t, auto* p) {
            using T = std::remove_pointer_t<decltype(t)>;
            using P = std::remove_pointer_t<decltype(p)>;
            if (relu6) normalize_kernel<T, P, true>(y, xc, mean, rstd, weight, bias, l);
            else normalize_kernel<T, P, false>(y, xc, mean, rstd, weight, bias, l);
          });
      }
      if (update) {
        NoGradGuard no_grad;  // a buffer update, never part of the graph
        double unbias = double(l.count()) / double(l.count() - 1);
        for (int64_t c = 0; c < l.C; ++c) bv[c] *= unbias;
        update_running(running_mean, bm, momentum);
        update_running(running_var, bv, momentum);
      }
    }
  }
  if (update) {
    running_mean.bump_version();
    running_var.bump_version();
  }
  if (auto node = make_node_if_needed<BatchNormBackward>({x, weight, bias}, training, param_dtype, relu6)) {
    if (keep_x) {
      node->x.save(x);
      node->mean.save(mean);
      node->rstd.save(rstd);
    }
    if (weight.defined() && (relu6 || wants_grad(x))) node->weight.save(weight);
    if (relu6 && bias.defined()) node->bias.save(bias);
    set_history(node, {x, weight, bias}, {y});
  }
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, false);
}

Tensor batch_norm_relu6(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, true);
}

}  // namespace mg
