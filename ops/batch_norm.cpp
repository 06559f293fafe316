// batch_norm over (N, C, H, W) or (N, C): per channel c, y = (x - mean_c) * rstd_c * w_c + b_c.
// Training normalises with the batch's statistics (biased variance) and, under no_grad, moves
// running_mean/var towards them (unbiased variance, PyTorch's momentum); eval uses the running
// statistics. x is viewed as (N, C, S), S = H * W; each channel is reduced by one thread in a
// fixed order, accumulating in f64, so results do not depend on the thread count.
//
// What BatchNormBackward saves: x plus mean and rstd (C each), and weight when dx is needed. As in
// layer_norm, x-hat would be a fresh (N, C, H, W) tensor, while x is the caller's own (at worst C
// floats more than x-hat + rstd); the (C) statistics are copies, so later in-place updates of the
// running buffers cannot reach backward. On cuda:N the same steps are ops/cuda/batch_norm.cu.
#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/parallel.h"
#include "ops/autocast_policy.h"
#include "ops/cuda/launchers.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

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

// Batch statistics: mean (C), biased var (C) in f64 two-pass sums; x contiguous.
template <class T>
void channel_stats(double* mean, double* var, const Tensor& x, const ChannelLayout& l) {
  const T* px = x.data<T>();
  for_channels(l, [&](int64_t c) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < l.N; ++n)
      for (const T *p = px + (n * l.C + c) * l.S, *e = p + l.S; p < e; ++p) s += double(compute_t<T>(*p));
    double m = s / double(l.count());
    for (int64_t n = 0; n < l.N; ++n)
      for (const T *p = px + (n * l.C + c) * l.S, *e = p + l.S; p < e; ++p) {
        double d = double(compute_t<T>(*p)) - m;
        q += d * d;
      }
    mean[c] = m, var[c] = q / double(l.count());
  });
}

// y = (x - mean) * rstd * w + b, parallel over the N * C planes of S values.
template <class T>
void normalize_kernel(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                      const Tensor& b, const ChannelLayout& l) {
  using S = stat_t<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const S *pm = mean.data<S>(), *pr = rstd.data<S>();
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  int64_t ws = w.defined() ? w.stride(0) : 0, bs = b.defined() ? b.stride(0) : 0;
  parallel_for(0, l.N * l.C, std::max<int64_t>(1, 16384 / l.S), [&](int64_t pb_, int64_t pe) {
    for (int64_t plane = pb_; plane < pe; ++plane) {
      int64_t c = plane % l.C;
      S scale = pr[c] * (pw ? S(pw[c * ws]) : S(1));  // y = x * scale + shift
      S shift = (pb ? S(pb[c * bs]) : S(0)) - S(pm[c]) * scale;
      const T* xi = px + plane * l.S;
      T* yi = py + plane * l.S;
      for (int64_t s = 0; s < l.S; ++s) yi[s] = T(S(xi[s]) * scale + shift);
    }
  });
}

// Per channel: sum dy (-> dbias) and sum dy * xhat (-> dweight); then dx. Training backward
// also carries the gradient through the batch statistics; eval's statistics are constants.
template <class T>
void batch_norm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                                const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                const ChannelLayout& l, bool training) {
  using S = stat_t<T>;
  const T *pdy = dy.data<T>(), *px = x.data<T>();
  const S *pm = mean.data<S>(), *pr = rstd.data<S>();
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  int64_t wst = w.defined() ? w.stride(0) : 0;
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  T* pdw = dw.defined() ? dw.data<T>() : nullptr;
  T* pdb = db.defined() ? db.data<T>() : nullptr;
  for_channels(l, [&](int64_t c) {
    double m = double(pm[c]), r = double(pr[c]);
    double sdy = 0, sdyh = 0;
    for (int64_t n = 0; n < l.N; ++n) {
      const T *g = pdy + (n * l.C + c) * l.S, *xi = px + (n * l.C + c) * l.S;
      for (int64_t s = 0; s < l.S; ++s) {
        double gv = double(compute_t<T>(g[s]));
        sdy += gv;
        sdyh += gv * (double(compute_t<T>(xi[s])) - m) * r;
      }
    }
    if (pdw) pdw[c] = T(S(sdyh));
    if (pdb) pdb[c] = T(S(sdy));
    if (!pdx) return;
    // training: dx = w * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)); eval: dx = w * rstd * dy
    S k = S(r * (pw ? double(compute_t<T>(pw[c * wst])) : 1.0));
    S a = training ? S(sdy / double(l.count())) : S(0);
    S bh = training ? S(sdyh / double(l.count())) : S(0);
    for (int64_t n = 0; n < l.N; ++n) {
      const T *g = pdy + (n * l.C + c) * l.S, *xi = px + (n * l.C + c) * l.S;
      T* o = pdx + (n * l.C + c) * l.S;
      for (int64_t s = 0; s < l.S; ++s) o[s] = T(k * (S(g[s]) - a - (S(xi[s]) - S(m)) * S(r) * bh));
    }
  });
}

class BatchNormBackward : public Node {
 public:
  explicit BatchNormBackward(bool training) : training_(training) {}
  std::string_view name() const override { return "BatchNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    bool need_dx = needs_input_grad(0), need_dw = needs_input_grad(1), need_db = needs_input_grad(2);
    int64_t C = g[0].size(1);
    std::vector<int64_t> not_channel = g[0].dim() == 4 ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0};
    if (!need_dx && !need_dw) return {Tensor(), Tensor(), sum(g[0], not_channel)};  // dbias only
    Tensor dy = contiguous_scratch(g[0]);
    TensorOptions opt{.dtype = dy.dtype(), .device = dy.device()};
    Tensor dx = need_dx ? empty(dy.shape(), opt) : Tensor();
    Tensor dw = need_dw ? empty({C}, opt) : Tensor();
    Tensor db = need_db ? empty({C}, opt) : Tensor();
    if (dy.is_meta() || C == 0) return {dx, dw, db};
    if (dy.numel() == 0) {  // eval on an empty batch: no contributions
      if (dw.defined()) fill_(dw, 0.0);
      if (db.defined()) fill_(db, 0.0);
      return {dx, dw, db};
    }
    Tensor xv = contiguous_scratch(x.unpack()), mv = mean.unpack(), rv = rstd.unpack();
    Tensor wv = weight.defined() ? weight.unpack() : Tensor();
    ChannelLayout l = channel_layout(xv);
#ifdef MG_WITH_CUDA
    if (dy.device().is_cuda()) {
      cuda::batch_norm_backward(dx, dw, db, dy, xv, mv, rv, wv, l.N, l.C, l.S, training_);
      return {dx, dw, db};
    }
#endif
    MG_DISPATCH_FLOAT(dy.dtype(), "batch_norm backward", [&] {
      batch_norm_backward_kernel<scalar_t>(dx, dw, db, dy, xv, mv, rv, wv, l, training_);
    });
    return {dx, dw, db};
  }
  SavedTensor x{this};       // (N, C, H, W) or (N, C): the input itself
  SavedTensor mean{this};    // (C) the mean used (batch or a copy of running)
  SavedTensor rstd{this};    // (C) 1 / sqrt(var + eps) used
  SavedTensor weight{this};  // (C) when dx is needed and weight is defined

 private:
  bool training_;
};

void check_channel_vector(const char* op, const Tensor& p, const Tensor& x, const char* what, bool same_dtype) {
  if (!p.defined()) return;
  check_same_device(op, x, p);
  if (same_dtype) check_same_dtype(op, x, p);
  else check_floating(op, p);
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

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  // Under autocast only the input and affine parameters are cast; the running statistics are
  // buffers updated in place, so they are never replaced by a copy.
  if (autocast_wants_f32({x, weight, bias}))
    return batch_norm(autocast_f32(x), running_mean, running_var, autocast_f32(weight), autocast_f32(bias), training,
                      momentum, eps);
  const char* op = "batch_norm";
  check_defined(op, x, "input");
  check_floating(op, x);
  MG_CHECK(x.dim() == 2 || x.dim() == 4, op, ": input must be (N, C, H, W) or (N, C), got shape ", x.shape());
  check_channel_vector(op, weight, x, "weight", true);
  check_channel_vector(op, bias, x, "bias", true);
  check_channel_vector(op, running_mean, x, "running_mean", false);
  check_channel_vector(op, running_var, x, "running_var", false);
  MG_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must both be given or both be undefined");
  MG_CHECK(training || running_mean.defined(), op,
           ": eval mode normalises with the running statistics, but running_mean and running_var are undefined"
           "\n  hint: pass training = true to use the batch's statistics");
  ChannelLayout l = channel_layout(x);
  MG_CHECK(!training || l.count() > 1, op, ": training needs more than 1 value per channel, got input ", x.shape());
  OpNameGuard name(op);
  bool record = any_requires_grad({x, weight, bias});
  bool keep_x = record && (wants_grad(x) || wants_grad(weight));
  DType sd = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});  // like x
  Tensor mean, rstd;                                                        // (C) each
  {
    MemoryCategoryGuard cat(keep_x ? current_memory_category() : MemoryCategory::workspace);
    mean = empty({l.C}, {.dtype = sd, .device = x.device()});
    rstd = empty({l.C}, {.dtype = sd, .device = x.device()});
  }
  bool update = training && running_mean.defined();
  if (!x.is_meta() && l.C > 0) {
    Tensor xc = contiguous_scratch(x);
    Tensor stats;  // (2, C) f64: the mean and the (biased, or running) variance
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);
      stats = empty({2, l.C}, {.dtype = DType::f64, .device = x.device()});
    }
#ifdef MG_WITH_CUDA
    if (x.device().is_cuda()) {
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
    } else
#endif
    {
      double *bm = stats.data<double>(), *bv = bm + l.C;
      if (training) {
        MG_DISPATCH_FLOAT(x.dtype(), op, [&] { channel_stats<scalar_t>(bm, bv, xc, l); });
      } else {
        Tensor s = stats.detach();
        copy_(select(s, 0, 0), running_mean.detach());
        copy_(select(s, 0, 1), running_var.detach());
      }
      auto store_stats = [&](auto* pm, auto* pr) {
        using S = std::remove_pointer_t<decltype(pm)>;
        for (int64_t c = 0; c < l.C; ++c) pm[c] = S(bm[c]), pr[c] = S(1.0 / std::sqrt(bv[c] + eps));
      };
      if (sd == DType::f64) store_stats(mean.data<double>(), rstd.data<double>());
      else store_stats(mean.data<float>(), rstd.data<float>());
      if (update) {
        NoGradGuard no_grad;  // a buffer update, never part of the graph
        double unbias = double(l.count()) / double(l.count() - 1);
        for (int64_t c = 0; c < l.C; ++c) bv[c] *= unbias;
        update_running(running_mean, bm, momentum);
        update_running(running_var, bv, momentum);
      }
      if (x.numel() > 0)
        MG_DISPATCH_FLOAT(x.dtype(), op, [&] { normalize_kernel<scalar_t>(y, xc, mean, rstd, weight, bias, l); });
    }
  }
  if (update) {
    running_mean.bump_version();
    running_var.bump_version();
  }
  if (auto node = make_node_if_needed<BatchNormBackward>({x, weight, bias}, training)) {
    if (keep_x) {
      node->x.save(x);
      node->mean.save(mean);
      node->rstd.save(rstd);
    }
    if (weight.defined() && wants_grad(x)) node->weight.save(weight);
    set_history(node, {x, weight, bias}, {y});
  }
  return y;
}

}  // namespace mg
