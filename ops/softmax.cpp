// softmax and log_softmax over any dim, numerically stable (the row max is subtracted before
// exp), with fused backward kernels. The input is viewed as (outer, n, inner) with the softmax
// dim in the middle; each of the outer * inner rows is reduced by one thread, in a fixed order.
//
// What each backward saves: only the output y (never x). softmax: dx = y * (dy - sum(dy * y));
// log_softmax: dx = dy - exp(y) * sum(dy). Both read y alone, so x can be freed after forward.
// On cuda:N the same (outer, n, inner) layout goes to ops/cuda/softmax.cu.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/autocast_policy.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/cuda/launchers.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

enum class SoftmaxKind { softmax, log_softmax };

// Accumulator: f64 for f64, f32 for f32/f16/bf16.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// t itself when contiguous, else a contiguous copy tagged workspace (freed when the op returns).
Tensor contiguous_scratch(const Tensor& t) {
  if (t.is_contiguous()) return t.detach();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return contiguous(t.detach());
}

// (outer, n, inner) around `dim` of a contiguous shape.
struct RowLayout {
  int64_t outer = 1, n = 1, inner = 1;
};

RowLayout row_layout(const Shape& s, int64_t dim) {
  RowLayout l;
  if (s.empty()) return l;  // 0-d: one row of one element
  for (int64_t d = 0; d < dim; ++d) l.outer *= s[size_t(d)];
  l.n = s[size_t(dim)];
  for (size_t d = size_t(dim) + 1; d < s.size(); ++d) l.inner *= s[d];
  return l;
}

// Calls row(base, stride) for every row of length l.n, parallel over rows.
template <class F>
void for_rows(const RowLayout& l, F row) {
  int64_t rows = l.outer * l.inner;
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, l.n));
  parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) row((r / l.inner) * l.n * l.inner + r % l.inner, l.inner);
  });
}

// y = softmax(x) or log_softmax(x) along the rows; x, y contiguous of one shape.
template <class T>
void softmax_kernel(const Tensor& y, const Tensor& x, const RowLayout& l, SoftmaxKind kind) {
  using A = acc_t<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for_rows(l, [&](int64_t base, int64_t st) {
    const T* xi = px + base;
    T* yi = py + base;
    A m = A(xi[0]);
    for (int64_t k = 1; k < l.n; ++k) m = std::max(m, A(xi[k * st]));
    A s = 0;
    if (kind == SoftmaxKind::softmax) {
      if constexpr (std::is_same_v<T, A>) {  // keep exp(x - m) in y, then scale it
        for (int64_t k = 0; k < l.n; ++k) yi[k * st] = fn::exp(xi[k * st] - m);  // vectorises
        for (int64_t k = 0; k < l.n; ++k) s += yi[k * st];
        A inv = A(1) / s;
        for (int64_t k = 0; k < l.n; ++k) yi[k * st] *= inv;
      } else {  // 16-bit y: recompute exp rather than round it twice
        s = fn::exp_sum(xi, l.n, st, m);
        A inv = A(1) / s;
        for (int64_t k = 0; k < l.n; ++k) yi[k * st] = T(fn::exp(A(xi[k * st]) - m) * inv);
      }
    } else {
      s = fn::exp_sum(xi, l.n, st, m);
      A lse = m + std::log(s);
      for (int64_t k = 0; k < l.n; ++k) yi[k * st] = T(A(xi[k * st]) - lse);
    }
  });
}

// dx from dy and the saved output y (all contiguous, one shape).
template <class T>
void softmax_backward_kernel(const Tensor& dx, const Tensor& dy, const Tensor& y, const RowLayout& l,
                             SoftmaxKind kind) {
  using A = acc_t<T>;
  const T* pdy = dy.data<T>();
  const T* py = y.data<T>();
  T* pdx = dx.data<T>();
  for_rows(l, [&](int64_t base, int64_t st) {
    const T *g = pdy + base, *yi = py + base;
    T* o = pdx + base;
    A s = 0;
    if (kind == SoftmaxKind::softmax) {
      for (int64_t k = 0; k < l.n; ++k) s += A(g[k * st]) * A(yi[k * st]);
      for (int64_t k = 0; k < l.n; ++k) o[k * st] = T(A(yi[k * st]) * (A(g[k * st]) - s));
    } else {
      for (int64_t k = 0; k < l.n; ++k) s += A(g[k * st]);
      for (int64_t k = 0; k < l.n; ++k) o[k * st] = T(A(g[k * st]) - fn::exp(A(yi[k * st])) * s);
    }
  });
}

class SoftmaxBackward : public Node {
 public:
  SoftmaxBackward(int64_t dim, SoftmaxKind kind) : dim_(dim), kind_(kind) {}
  std::string_view name() const override {
    return kind_ == SoftmaxKind::softmax ? "SoftmaxBackward" : "LogSoftmaxBackward";
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Tensor yv = y.unpack();  // contiguous: it is the forward's own output
    Tensor dy = contiguous_scratch(grads[0]);
    Tensor dx = empty(yv.shape(), {.dtype = yv.dtype(), .device = yv.device()});
    if (!skip_kernel(dx)) {  // dy's scratch copy (above) is made on meta too
      RowLayout l = row_layout(yv.shape(), dim_);
      if (yv.device().is_cuda()) {
        cuda::softmax_backward(dx, dy, yv, l.outer, l.n, l.inner, kind_ == SoftmaxKind::log_softmax);
        return {dx};
      }
      MG_DISPATCH_FLOAT(yv.dtype(), name().data(), [&] { softmax_backward_kernel<scalar_t>(dx, dy, yv, l, kind_); });
    }
    return {dx};
  }
  SavedTensor y{this};  // (..., n, ...) the output

 private:
  int64_t dim_;
  SoftmaxKind kind_;
};

Tensor softmax_impl(const char* op, const Tensor& x, int64_t dim, SoftmaxKind kind) {
  if (autocast_wants_f32({x})) return softmax_impl(op, autocast_f32(x), dim, kind);
  check_defined(op, x, "input");
  check_floating(op, x);
  int64_t d = wrap_dim(dim, x.dim(), op);
  OpNameGuard name(op);
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});  // same shape as x
  Tensor xc = y.numel() > 0 ? contiguous_scratch(x) : x;  // on meta too: exact bytes
  if (!skip_kernel(y)) {
    RowLayout l = row_layout(x.shape(), d);
    if (x.device().is_cuda()) cuda::softmax_forward(y, xc, l.outer, l.n, l.inner, kind == SoftmaxKind::log_softmax);
    else MG_DISPATCH_FLOAT(x.dtype(), op, [&] { softmax_kernel<scalar_t>(y, xc, l, kind); });
  }
  if (auto node = make_node_if_needed<SoftmaxBackward>({x}, d, kind)) {
    node->y.save(y);
    set_history(node, {x}, {y});
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl("softmax", x, dim, SoftmaxKind::softmax); }

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl("log_softmax", x, dim, SoftmaxKind::log_softmax);
}

}  // namespace mg
