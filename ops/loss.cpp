// Losses: cross_entropy fused with log-softmax, and mse_loss. Both return a 0-d mean.
//
// cross_entropy never materialises the (N, C) log-probabilities: forward computes, per row, the
// max and lse = log(sum(exp(x))) and reads x[target] once; backward recomputes
// softmax = exp(x - lse) from the logits. What CrossEntropyBackward saves: the logits (the
// caller's own tensor, no copy), the targets (N) and lse (N, f32; f64 for f64 logits): the only
// new memory is N floats, against N * C for a log_softmax + nll composition.
// linear_cross_entropy fuses the LM head into it: the (N, V) logits exist only as (R, V) chunks
// of workspace, R rows at a time (forward and backward each recompute them); it saves hidden,
// weight (the caller's), the targets and lse (N).
// What MseLossBackward saves: input and target (the caller's tensors, nothing new).
// On cuda:N (ops/cuda/loss.cu, reduce.cu) the targets are checked on the device, the loss is
// written there and the backward reads dloss there: no host round trip besides the count.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/flop_counter.h"
#include "core/parallel.h"
#include "ops/cpu_gemm.h"
#include "ops/autocast_policy.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/cuda/launchers.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Per-row statistics are kept in f64 for f64 inputs (gradcheck) and in f32 otherwise.
DType stat_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// ---- cross_entropy ---------------------------------------------------------------------------

// Checks every target is in [0, C) or ignore_index (serially, so the first bad one is named
// whatever the thread count); returns how many rows count towards the mean.
template <class I>
int64_t count_targets(const Tensor& target, int64_t C, int64_t ignore_index) {
  const I* t = target.data<I>();
  int64_t st = target.stride(0), count = 0;
  for (int64_t i = 0; i < target.size(0); ++i) {
    int64_t v = int64_t(t[i * st]);
    if (v == ignore_index) continue;
    MG_CHECK(v >= 0 && v < C, "cross_entropy: target ", v, " at position ", i, " is out of range [0, ", C,
             ") (ignore_index is ", ignore_index, ")");
    ++count;
  }
  return count;
}

// lse: (N) = log(sum_j exp(x[i, j])) for counted rows (0 for ignored ones); returns the loss sum
// sum_i (lse[i] - x[i, t_i]), added in row order. x may have any strides.
template <class T, class I>
double cross_entropy_forward_kernel(const Tensor& lse, const Tensor& x, const Tensor& target, int64_t ignore_index) {
  using S = std::conditional_t<std::is_same_v<T, double>, double, float>;  // stat type
  int64_t N = x.size(0), C = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  const T* px = x.data<T>();
  const I* pt = target.data<I>();
  int64_t ts = target.stride(0);
  S* pl = lse.data<S>();
  parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (int64_t(pt[i * ts]) == ignore_index) {
        pl[i] = 0;
        continue;
      }
      const T* row = px + i * s0;
      S m = S(row[0]);
      for (int64_t j = 1; j < C; ++j) m = std::max(m, S(row[j * s1]));
      S s = 0;
      s = fn::exp_sum(row, C, s1, m);
      pl[i] = m + std::log(s);
    }
  });
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {
    int64_t t = int64_t(pt[i * ts]);
    if (t != ignore_index) total += double(pl[i]) - double(S(px[i * s0 + t * s1]));
  }
  return total;
}

// dx: (N, C) contiguous = (exp(x - lse) - onehot(target)) * scale; ignored rows are zero.
template <class T, class I>
void cross_entropy_backward_kernel(const Tensor& dx, const Tensor& x, const Tensor& target, const Tensor& lse,
                                   int64_t ignore_index, double scale) {
  using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
  int64_t N = x.size(0), C = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  const T* px = x.data<T>();
  const I* pt = target.data<I>();
  int64_t ts = target.stride(0);
  const S* pl = lse.data<S>();
  T* pd = dx.data<T>();
  S k = S(scale);
  parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t t = int64_t(pt[i * ts]);
      T* o = pd + i * C;
      if (t == ignore_index) {
        std::fill(o, o + C, T(0.0f));
        continue;
      }
      const T* row = px + i * s0;
      for (int64_t j = 0; j < C; ++j) o[j] = T(fn::exp(S(row[j * s1]) - pl[i]) * k);
      o[t] = T((fn::exp(S(row[t * s1]) - pl[i]) - S(1)) * k);
    }
  });
}

class CrossEntropyBackward : public Node {
 public:
  CrossEntropyBackward(int64_t ignore_index, int64_t count) : ignore_index_(ignore_index), count_(count) {}
  std::string_view name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor xv = logits.unpack(), tv = target.unpack(), lv = lse.unpack();
    Tensor dx = empty(xv.shape(), {.dtype = xv.dtype(), .device = xv.device()});  // (N, C)
    if (!skip_kernel(dx)) {
      if (xv.device().is_cuda()) {
        cuda::cross_entropy_backward(dx, xv, tv, lv, g[0], ignore_index_, count_);
        return {dx};
      }
      // count_ == 0 (every target ignored): the loss was the constant 0, so the gradient is 0.
      double scale = count_ == 0 ? 0.0 : g[0].item_double() / double(count_);
      MG_DISPATCH_FLOAT(xv.dtype(), "cross_entropy backward", [&] {
        using T = scalar_t;
        MG_DISPATCH_INDEX(tv.dtype(), "cross_entropy backward", [&] {
          cross_entropy_backward_kernel<T, scalar_t>(dx, xv, tv, lv, ignore_index_, scale);
        });
      });
    }
    return {dx};
  }
  SavedTensor logits{this};  // (N, C) the input itself
  SavedTensor target{this};  // (N) class indices
  SavedTensor lse{this};     // (N) per-row log-sum-exp

 private:
  int64_t ignore_index_;
  int64_t count_;  // rows whose target is not ignore_index
};

// ---- linear_cross_entropy --------------------------------------------------------------------

constexpr int64_t kChunkElems = int64_t(1) << 20;  // logits per chunk: 4 MiB of f32

// Rows per chunk: shapes alone decide it (never the thread count), at least one row.
int64_t chunk_rows(int64_t N, int64_t V) { return std::clamp<int64_t>(kChunkElems / std::max<int64_t>(V, 1), 1, std::max<int64_t>(N, 1)); }

// logits (r, V) = hidden[i0 : i0 + r] weight^T, into the first r rows of chunk.
template <class T>
Tensor chunk_logits(const Tensor& chunk, const Tensor& h, const Tensor& w, int64_t i0, int64_t r) {
  const int64_t V = w.size(0), C = w.size(1);
  Tensor out = narrow(chunk, 0, 0, r);
  cpu_gemm(Transpose::no, Transpose::yes, r, V, C, T(1), h.data<T>() + i0 * h.stride(0), h.stride(0), w.data<T>(),
           w.stride(0), T(0), out.data<T>(), V);
  return out;
}

class LinearCrossEntropyBackward : public Node {
 public:
  LinearCrossEntropyBackward(int64_t ignore_index, int64_t count) : ignore_index_(ignore_index), count_(count) {}
  std::string_view name() const override { return "LinearCrossEntropyBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor h = hidden.unpack(), w = weight.unpack(), tv = target.unpack(), lv = lse.unpack();
    const int64_t N = h.size(0), V = w.size(0), C = w.size(1), R = chunk_rows(N, V);
    const TensorOptions opt{.dtype = h.dtype(), .device = h.device()};
    Tensor dh = needs_input_grad(0) ? empty(h.shape(), opt) : Tensor();  // (N, C)
    Tensor dw = needs_input_grad(1) ? empty(w.shape(), opt) : Tensor();  // (V, C)
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    Tensor chunk = empty({R, V}, opt), dchunk = empty({R, V}, opt);  // (R, V) logits and their gradient
    count_flops(FlopKind::gemm_f32, 2.0 * double(N) * double(V) * double(C) * (1 + int(dh.defined()) + int(dw.defined())));
    if (h.is_meta()) return {dh, dw};
    if (dw.defined()) fill_(dw, 0.0);
    if (N == 0) return {dh, dw};
    const double scale = count_ == 0 ? 0.0 : g[0].item_double() / double(count_);
    auto run = [&](auto zero) {
      using T = decltype(zero);
      for (int64_t i0 = 0; i0 < N; i0 += R) {
        const int64_t r = std::min(R, N - i0);
        Tensor x = chunk_logits<T>(chunk, h, w, i0, r), dx = narrow(dchunk, 0, 0, r);
        MG_DISPATCH_INDEX(tv.dtype(), "linear_cross_entropy backward", [&] {
          cross_entropy_backward_kernel<T, scalar_t>(dx, x, narrow(tv, 0, i0, r), narrow(lv, 0, i0, r), ignore_index_,
                                                     scale);
        });
        if (dh.defined())  // dh rows = dx weight
          cpu_gemm(Transpose::no, Transpose::no, r, C, V, T(1), dx.data<T>(), V, w.data<T>(), w.stride(0), T(0),
                   dh.data<T>() + i0 * C, C);
        if (dw.defined())  // dw += dx^T hidden rows
          cpu_gemm(Transpose::yes, Transpose::no, V, C, r, T(1), dx.data<T>(), V, h.data<T>() + i0 * h.stride(0),
                   h.stride(0), T(1), dw.data<T>(), C);
      }
    };
    if (h.dtype() == DType::f64) run(0.0);
    else run(0.0f);  // forward admits f32 and f64 only
    return {dh, dw};
  }
  SavedTensor hidden{this}, weight{this};  // (N, C), (V, C): the caller's tensors
  SavedTensor target{this};                // (N) class indices
  SavedTensor lse{this};                   // (N) per-row log-sum-exp

 private:
  int64_t ignore_index_;
  int64_t count_;
};

// ---- mse_loss --------------------------------------------------------------------------------

// sum((a - b)^2) over contiguous a, b in fixed chunks; chunk partials in a workspace tensor,
// added in order (same bits on any thread count).
template <class T>
double squared_error_sum(const Tensor& a, const Tensor& b) {
  constexpr int64_t kChunk = 16384;
  int64_t n = a.numel(), chunks = (n + kChunk - 1) / kChunk;
  if (n == 0) return 0.0;
  Tensor partial;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    partial = empty({chunks}, {.dtype = DType::f64, .device = a.device()});  // (chunks)
  }
  const T *pa = a.data<T>(), *pb = b.data<T>();
  double* pp = partial.data<double>();
  parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      using A = compute_t<T>;
      A s = 0;
      for (int64_t i = c * kChunk, e = std::min(n, (c + 1) * kChunk); i < e; ++i) {
        A d = A(pa[i]) - A(pb[i]);
        s += d * d;
      }
      pp[c] = double(s);
    }
  });
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += pp[c];
  return total;
}

class MseLossBackward : public Node {
 public:
  std::string_view name() const override { return "MseLossBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor a = input.unpack(), b = target.unpack();
    // d/da mean((a - b)^2) = 2 (a - b) / n; d/db is its negation.
    Tensor da = mul(sub(a, b), mul(g[0], 2.0 / double(a.numel())));
    return {needs_input_grad(0) ? da : Tensor(), needs_input_grad(1) ? neg(da) : Tensor()};
  }
  SavedTensor input{this}, target{this};  // the caller's tensors
};

Tensor contiguous_scratch(const Tensor& t) {
  if (t.is_contiguous()) return t.detach();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return contiguous(t.detach());
}

}  // namespace

// logits: (N, C), target: (N) -> (). All targets ignored gives loss 0 and a zero gradient
// (a batch of padding contributes nothing); PyTorch returns NaN (0 / 0) there instead.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  if (autocast_wants_f32({logits})) return cross_entropy(autocast_f32(logits), target, ignore_index);
  const char* op = "cross_entropy";
  check_defined(op, logits, "logits");
  check_defined(op, target, "target");
  check_same_device(op, logits, target);
  check_floating(op, logits);
  MG_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op,
           ": target must hold class indices (i64 or i32), got ", target.dtype());
  MG_CHECK(logits.dim() == 2, op, ": logits must be (N, C), got shape ", logits.shape());
  MG_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), op, ": target must have shape (N) = ",
           Shape{logits.size(0)}, " for logits ", logits.shape(), ", got ", target.shape());
  MG_CHECK(logits.size(1) > 0, op, ": logits have no classes, shape ", logits.shape());
  OpNameGuard name(op);
  int64_t N = logits.size(0), C = logits.size(1);
  int64_t count = 0;
  if (logits.device().is_cuda()) count = cuda::cross_entropy_count(target, C, ignore_index);
  else if (!logits.is_meta())
    count = MG_DISPATCH_INDEX(target.dtype(), op, [&] { return count_targets<scalar_t>(target, C, ignore_index); });
  Tensor loss = empty({}, {.dtype = logits.dtype(), .device = logits.device()});                    // ()
  Tensor lse = empty({N}, {.dtype = stat_dtype(logits.dtype()), .device = logits.device()});        // (N)
  if (logits.device().is_cuda()) cuda::cross_entropy_forward(loss, lse, logits, target, ignore_index, count);
  else if (!loss.is_meta()) {
    double total = 0;
    if (N > 0) {
      MG_DISPATCH_FLOAT(logits.dtype(), op, [&] {
        using T = scalar_t;
        MG_DISPATCH_INDEX(target.dtype(), op, [&] {
          total = cross_entropy_forward_kernel<T, scalar_t>(lse, logits, target, ignore_index);
        });
      });
    }
    fill_(loss, count == 0 ? 0.0 : total / double(count));
  }
  if (auto node = make_node_if_needed<CrossEntropyBackward>({logits}, ignore_index, count)) {
    node->logits.save(logits);
    node->target.save(target);
    node->lse.save(lse);
    set_history(node, {logits}, {loss});
  }
  return loss;
}

// input, target: the same shape (no broadcasting: an (N, 1) vs (N) mix-up is an error, not an
// (N, N) loss) -> ().
Tensor mse_loss(const Tensor& input, const Tensor& target) {
  if (autocast_wants_f32({input, target})) return mse_loss(autocast_f32(input), autocast_f32(target));
  const char* op = "mse_loss";
  check_defined(op, input, "input");
  check_defined(op, target, "target");
  check_same_device(op, input, target);
  check_same_dtype(op, input, target);
  check_floating(op, input);
  MG_CHECK(input.shape() == target.shape(), op, ": input and target shapes differ, ", input.shape(), " vs ",
           target.shape());
  OpNameGuard name(op);
  Tensor loss = empty({}, {.dtype = input.dtype(), .device = input.device()});  // ()
  if (!loss.is_meta()) {
    Tensor a = contiguous_scratch(input), b = contiguous_scratch(target);
    if (input.device().is_cuda()) {
      cuda::mse_loss(loss, a, b);
    } else {
      double total = MG_DISPATCH_FLOAT(input.dtype(), op, [&] { return squared_error_sum<scalar_t>(a, b); });
      fill_(loss, total / double(input.numel()));  // an empty input gives NaN, as a mean of nothing
    }
  }
  if (auto node = make_node_if_needed<MseLossBackward>({input, target})) {
    node->input.save(input);
    node->target.save(target);
    set_history(node, {input, target}, {loss});
  }
  return loss;
}

// hidden: (N, C), weight: (V, C), target: (N) -> () = cross_entropy(linear(hidden, weight), target)
// with the logits made and dropped chunk by chunk (f32 / f64 on cpu:N and meta).
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& target, int64_t ignore_index) {
  const char* op = "linear_cross_entropy";
  check_defined(op, hidden, "hidden");
  check_defined(op, weight, "weight");
  check_defined(op, target, "target");
  check_same_device(op, hidden, weight);
  check_same_device(op, hidden, target);
  check_same_dtype(op, hidden, weight);
  MG_CHECK(hidden.dtype() == DType::f32 || hidden.dtype() == DType::f64, op, ": expected f32 or f64, got ",
           hidden.dtype(), "\n  hint: under autocast or for 16-bit models use cross_entropy(linear(...))");
  MG_CHECK(!hidden.device().is_cuda(), op, ": no CUDA kernel; use cross_entropy(linear(hidden, weight), target)");
  MG_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op,
           ": target must hold class indices (i64 or i32), got ", target.dtype());
  MG_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1), op,
           ": expected hidden (N, C) and weight (V, C), got ", hidden.shape(), " and ", weight.shape());
  MG_CHECK(target.dim() == 1 && target.size(0) == hidden.size(0), op, ": target must have shape (N) = ",
           Shape{hidden.size(0)}, ", got ", target.shape());
  MG_CHECK(weight.size(0) > 0, op, ": weight has no classes, shape ", weight.shape());
  OpNameGuard name(op);
  const Tensor h = contiguous_scratch(hidden), w = contiguous_scratch(weight);  // row-major operands
  const int64_t N = h.size(0), V = w.size(0), R = chunk_rows(N, V);
  count_flops(FlopKind::gemm_f32, 2.0 * double(N) * double(V) * double(h.size(1)));  // the logits
  int64_t count = 0;
  if (!h.is_meta())
    count = MG_DISPATCH_INDEX(target.dtype(), op, [&] { return count_targets<scalar_t>(target, V, ignore_index); });
  Tensor loss = empty({}, {.dtype = h.dtype(), .device = h.device()});  // ()
  Tensor lse = empty({N}, {.dtype = h.dtype(), .device = h.device()});   // (N)
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    Tensor chunk = empty({R, V}, {.dtype = h.dtype(), .device = h.device()});  // (R, V) logits
    if (!loss.is_meta()) {
      double total = 0;
      auto run = [&](auto zero) {
        using T = decltype(zero);
        for (int64_t i0 = 0; i0 < N; i0 += R) {
          const int64_t r = std::min(R, N - i0);
          Tensor x = chunk_logits<T>(chunk, h, w, i0, r);
          MG_DISPATCH_INDEX(target.dtype(), op, [&] {
            total += cross_entropy_forward_kernel<T, scalar_t>(narrow(lse, 0, i0, r), x, narrow(target, 0, i0, r),
                                                               ignore_index);
          });
        }
      };
      if (h.dtype() == DType::f64) run(0.0);
      else run(0.0f);
      fill_(loss, count == 0 ? 0.0 : total / double(count));
    }
  }
  if (auto node = make_node_if_needed<LinearCrossEntropyBackward>({hidden, weight}, ignore_index, count)) {
    node->hidden.save(h);
    node->weight.save(w);
    node->target.save(target);
    node->lse.save(lse);
    set_history(node, {hidden, weight}, {loss});
  }
  return loss;
}

}  // namespace mg
