// layer_norm over the last dim: y = (x - mean) * rstd * weight + bias, one row of C per thread
// task. x is viewed as (M, C) rows; statistics are two-pass (mean, then centred squares).
//
// What LayerNormBackward saves: x plus mean and rstd (M each), not x-hat. Backward needs rstd
// either way (dx = rstd * (...)), so x-hat + rstd is a fresh (M, C) tensor plus M floats, while
// x + mean + rstd is the caller's tensor plus 2M floats: at worst M floats more (when nothing
// else keeps x alive), and M * C less whenever x is live anyway (saved by another op, an input).
// llm.c makes the same choice. Weight is saved when dx is needed (dx reads it).
// dweight/dbias are summed over fixed blocks of rows, the block partials added in order (on
// cuda:N too: ops/cuda/layer_norm.cu follows the same blocks). The per-row sums (mean, variance,
// backward's two means) run 8 rows at a time: Note [LayerNorm row sums].
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/autocast_policy.h"
#include "ops/cuda/launchers.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

constexpr int64_t kRowsPerBlock = 32;  // rows per dweight/dbias partial (fixed: thread-independent)

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

Tensor contiguous_scratch(const Tensor& t) {
  if (t.is_contiguous()) return t.detach();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return contiguous(t.detach());
}

bool wants_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

// Note [LayerNorm row sums]. Each row's sums add their terms left to right, and a variance term
// is the product (x - mean)^2 rounded before it is added (no fused multiply-add: the bits GCC's
// vectorised loop gave when memgrad's losses were pinned, whose vector part squares first and
// adds lane by lane). A sum's adds wait on each other, so rows are done kRows at a time: their
// chains advance together, one add per row per column. The terms of a block of columns are made
// by a vectorised loop into a small buffer first; the adds read them back from it, so no compiler
// can fuse a product into its add.
constexpr int kRows = 8;       // rows whose sums advance together
constexpr int64_t kCols = 64;  // columns per block of terms

// sum[q] = terms(q, j) added for j = 0 .. C-1 in order, for rows q < R; terms(q, j0, len, out)
// writes row q's terms of columns [j0, j0 + len) to out. R is fixed so the R sums stay in registers.
template <int R, class S, class Terms>
inline void row_sums_of(int64_t C, S* sum, Terms& terms) {
  S acc[R] = {};
  alignas(64) S buf[R][kCols];
  for (int64_t j0 = 0; j0 < C; j0 += kCols) {
    const int64_t len = std::min(kCols, C - j0);
    for (int q = 0; q < R; ++q) terms(q, j0, len, buf[q]);
    for (int64_t j = 0; j < len; ++j)
      for (int q = 0; q < R; ++q) acc[q] += buf[q][j];
  }
  for (int q = 0; q < R; ++q) sum[q] = acc[q];
}

// row_sums_of for n <= kRows rows: kRows at once, or one at a time for a last, partial group.
template <class S, class Terms>
void row_sums(int n, int64_t C, S* sum, Terms&& terms) {
  if (n == kRows) return row_sums_of<kRows>(C, sum, terms);
  for (int q = 0; q < n; ++q) {
    auto one = [&](int, int64_t j0, int64_t len, S* out) { terms(q, j0, len, out); };
    row_sums_of<1>(C, sum + q, one);
  }
}

// y = (x - m) r (then * w, + b) for one row of C. Weight and bias both there take one fused
// multiply-add, (x - m) r rounded first: what the loop before it computed (GCC contracted it).
// Unit-stride weight and bias take a loop that vectorises.
template <class T, class S>
void normalize_row(T* y, const T* x, int64_t C, S m, S r, const T* w, int64_t ws, const T* b, int64_t bs) {
  if (w && b && ws == 1 && bs == 1) {
    for (int64_t j = 0; j < C; ++j) y[j] = T(std::fma((S(x[j]) - m) * r, S(w[j]), S(b[j])));
    return;
  }
  for (int64_t j = 0; j < C; ++j) {
    S h = (S(x[j]) - m) * r;
    if (w && b) h = std::fma(h, S(w[j * ws]), S(b[j * bs]));
    else if (w) h *= S(w[j * ws]);
    else if (b) h += S(b[j * bs]);
    y[j] = T(h);
  }
}

// y, x: (M, C) contiguous; w, b: (C) or undefined; mean, rstd: (M).
template <class T>
void layer_norm_kernel(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps) {
  using S = stat_t<T>;
  int64_t C = x.size(-1), M = x.numel() / C;
  const T* px = x.data<T>();
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  int64_t ws = w.defined() ? w.stride(0) : 0, bs = b.defined() ? b.stride(0) : 0;
  T* py = y.data<T>();
  S *pm = mean.data<S>(), *pr = rstd.data<S>();
  parallel_for(0, M, std::max<int64_t>(kRows, 16384 / C), [&](int64_t rb, int64_t re) {
    for (int64_t i0 = rb; i0 < re; i0 += kRows) {
      const int n = int(std::min<int64_t>(kRows, re - i0));
      const T* x0 = px + i0 * C;
      // mean = (x_0 + x_1 + ...) / C, then var = (sum of rounded (x_j - mean)^2) / C.
      row_sums<S>(n, C, pm + i0, [&](int q, int64_t j0, int64_t len, S* out) {
        for (int64_t j = 0; j < len; ++j) out[j] = S(x0[q * C + j0 + j]);
      });
      for (int q = 0; q < n; ++q) pm[i0 + q] /= S(C);
      S var[kRows];
      row_sums<S>(n, C, var, [&](int q, int64_t j0, int64_t len, S* out) {
        const S m = pm[i0 + q];
        for (int64_t j = 0; j < len; ++j) {
          const S d = S(x0[q * C + j0 + j]) - m;
          out[j] = d * d;
        }
      });
      for (int q = 0; q < n; ++q) pr[i0 + q] = S(1) / std::sqrt(var[q] / S(C) + S(eps));
      for (int64_t i = i0; i < i0 + n; ++i) normalize_row(py + i * C, px + i * C, C, pm[i], pr[i], pw, ws, pb, bs);
    }
  });
}

// The backward kernel's workspace when dw or db is wanted: (blocks, 2, C) in the statistics'
// dtype, per block of kRowsPerBlock rows the sum of dy * xhat and the sum of dy. Allocated by the
// caller on every device, meta included.
Tensor backward_partial(const Tensor& x, const Tensor& mean) {
  const int64_t C = x.size(-1), M = C == 0 ? 0 : x.numel() / C;
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return empty({(M + kRowsPerBlock - 1) / kRowsPerBlock, 2, C}, {.dtype = mean.dtype(), .device = x.device()});
}

// dx: (M, C) or undefined; dw, db: (C) or undefined. dy, x contiguous (M, C); w (C) or undefined;
// partial: backward_partial(x, mean) when dw or db is wanted.
template <class T>
void layer_norm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                                const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                const Tensor& partial) {
  using S = stat_t<T>;
  int64_t C = x.size(-1), M = x.numel() / C;
  int64_t blocks = (M + kRowsPerBlock - 1) / kRowsPerBlock;
  bool want_params = dw.defined() || db.defined();
  const T *pdy = dy.data<T>(), *px = x.data<T>();
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  int64_t wst = w.defined() ? w.stride(0) : 0;
  const S *pm = mean.data<S>(), *pr = rstd.data<S>();
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  S* pp = want_params ? partial.data<S>() : nullptr;
  // The weight in S at unit stride (C values), so the row loops below vectorise.
  std::vector<S> wc(pw ? size_t(C) : 0);
  for (int64_t j = 0; j < int64_t(wc.size()); ++j) wc[size_t(j)] = S(pw[j * wst]);
  const S* ws = pw ? wc.data() : nullptr;
  parallel_for(0, blocks, 1, [&](int64_t bb, int64_t be) {
    for (int64_t blk = bb; blk < be; ++blk) {
      S* pdw = pp ? pp + blk * 2 * C : nullptr;  // (C) partial dweight
      S* pdb = pp ? pdw + C : nullptr;           // (C) partial dbias
      if (pp) std::fill(pdw, pdw + 2 * C, S(0));
      const int64_t ib = blk * kRowsPerBlock, ie = std::min(M, (blk + 1) * kRowsPerBlock);
      // dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = dy * weight: the two row
      // means first (Note [LayerNorm row sums]), then each row's pass.
      S ga[kRowsPerBlock], gc[kRowsPerBlock];
      if (pdx) {
        for (int64_t i0 = ib; i0 < ie; i0 += kRows) {
          const int n = int(std::min<int64_t>(kRows, ie - i0));
          // gh = dy * weight for row i, columns [j0, j0 + len).
          auto gh = [&](int64_t i, int64_t j0, int64_t len, S* out) {
            const T* g = pdy + i * C + j0;
            if (ws)
              for (int64_t j = 0; j < len; ++j) out[j] = S(g[j]) * ws[j0 + j];
            else
              for (int64_t j = 0; j < len; ++j) out[j] = S(g[j]);
          };
          row_sums<S>(n, C, ga + (i0 - ib), [&](int q, int64_t j0, int64_t len, S* out) { gh(i0 + q, j0, len, out); });
          row_sums<S>(n, C, gc + (i0 - ib), [&](int q, int64_t j0, int64_t len, S* out) {
            const int64_t i = i0 + q;
            const S m = pm[i], r = pr[i];
            gh(i, j0, len, out);
            const T* xi = px + i * C + j0;
            for (int64_t j = 0; j < len; ++j) out[j] = out[j] * (S(xi[j]) - m) * r;
          });
        }
      }
      for (int64_t i = ib; i < ie; ++i) {
        const T *g = pdy + i * C, *xi = px + i * C;
        S m = pm[i], r = pr[i];
        if (pp)
          for (int64_t j = 0; j < C; ++j) {
            pdw[j] += S(g[j]) * (S(xi[j]) - m) * r;
            pdb[j] += S(g[j]);
          }
        if (!pdx) continue;
        const S a = ga[i - ib] / S(C), c = gc[i - ib] / S(C);
        T* o = pdx + i * C;
        if (ws) {
          for (int64_t j = 0; j < C; ++j) {
            const S gh = S(g[j]) * ws[j];
            o[j] = T(r * (gh - a - (S(xi[j]) - m) * r * c));
          }
        } else {
          for (int64_t j = 0; j < C; ++j) o[j] = T(r * (S(g[j]) - a - (S(xi[j]) - m) * r * c));
        }
      }
    }
  });
  if (!pp) return;
  T* odw = dw.defined() ? dw.data<T>() : nullptr;
  T* odb = db.defined() ? db.data<T>() : nullptr;
  parallel_for(0, C, 4096, [&](int64_t jb, int64_t je) {
    for (int64_t j = jb; j < je; ++j) {
      S sw = 0, sb = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) sw += pp[blk * 2 * C + j], sb += pp[blk * 2 * C + C + j];
      if (odw) odw[j] = T(sw);
      if (odb) odb[j] = T(sb);
    }
  });
}

class LayerNormBackward : public Node {
 public:
  std::string_view name() const override { return "LayerNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    bool need_dx = needs_input_grad(0), need_dw = needs_input_grad(1), need_db = needs_input_grad(2);
    int64_t C = g[0].size(-1);
    if (!need_dx && !need_dw) return {Tensor(), Tensor(), sum_to(reshape(g[0], {-1, C}), {C})};  // dbias only
    Tensor dy = contiguous_scratch(g[0]);
    TensorOptions opt{.dtype = dy.dtype(), .device = dy.device()};
    Tensor dx = need_dx ? empty(dy.shape(), opt) : Tensor();
    Tensor dw = need_dw ? empty({C}, opt) : Tensor();
    Tensor db = need_db ? empty({C}, opt) : Tensor();
    if (dy.numel() == 0) {  // no rows: zero parameter gradients
      if (dw.defined() && !dw.is_meta()) fill_(dw, 0.0);
      if (db.defined() && !db.is_meta()) fill_(db, 0.0);
      return {dx, dw, db};
    }
    Tensor xv = contiguous_scratch(x.unpack()), mv = mean.unpack(), rv = rstd.unpack();  // on meta too: exact bytes
    Tensor wv = weight.defined() ? weight.unpack() : Tensor();
    const Tensor partial = (dw.defined() || db.defined()) && !dy.device().is_cuda() ? backward_partial(xv, mv) : Tensor();
    if (dy.is_meta()) return {dx, dw, db};
    if (dy.device().is_cuda()) {
      cuda::layer_norm_backward(dx, dw, db, dy, xv, mv, rv, wv);
      return {dx, dw, db};
    }
    MG_DISPATCH_FLOAT(dy.dtype(), "layer_norm backward",
                      [&] { layer_norm_backward_kernel<scalar_t>(dx, dw, db, dy, xv, mv, rv, wv, partial); });
    return {dx, dw, db};
  }
  SavedTensor x{this};       // (..., C) the input itself, when dx or dweight is needed
  SavedTensor mean{this};    // (M) per-row mean
  SavedTensor rstd{this};    // (M) per-row 1 / sqrt(var + eps)
  SavedTensor weight{this};  // (C) when dx is needed and weight is defined
};

void check_param(const char* op, const Tensor& p, const Tensor& x, const char* what) {
  if (!p.defined()) return;
  check_same_device(op, x, p);
  check_same_dtype(op, x, p);
  MG_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), op, ": ", what, " must have shape ", Shape{x.size(-1)},
           " for input ", x.shape(), ", got ", p.shape());
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  if (autocast_wants_f32({x, weight, bias})) return layer_norm(autocast_f32(x), autocast_f32(weight), autocast_f32(bias), eps);
  const char* op = "layer_norm";
  check_defined(op, x, "input");
  check_floating(op, x);
  MG_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": input must be (..., C) with C > 0, got shape ", x.shape());
  check_param(op, weight, x, "weight");
  check_param(op, bias, x, "bias");
  OpNameGuard name(op);
  int64_t C = x.size(-1), M = x.numel() / C;
  bool record = any_requires_grad({x, weight, bias});
  bool keep_x = record && (wants_grad(x) || wants_grad(weight));
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});  // (..., C)
  Tensor mean, rstd;                                                        // (M) each
  {
    // Statistics are activations only when backward will read them.
    MemoryCategoryGuard cat(keep_x ? current_memory_category() : MemoryCategory::workspace);
    DType sd = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
    mean = empty({M}, {.dtype = sd, .device = x.device()});
    rstd = empty({M}, {.dtype = sd, .device = x.device()});
  }
  if (y.numel() > 0) {
    Tensor xc = contiguous_scratch(x);  // on meta too: exact bytes
    if (y.is_meta()) {
      // shapes and bytes only
    } else if (x.device().is_cuda()) cuda::layer_norm_forward(y, mean, rstd, xc, weight, bias, eps);
    else MG_DISPATCH_FLOAT(x.dtype(), op, [&] { layer_norm_kernel<scalar_t>(y, mean, rstd, xc, weight, bias, eps); });
  }
  if (auto node = make_node_if_needed<LayerNormBackward>({x, weight, bias})) {
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
