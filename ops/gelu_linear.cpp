// gelu_linear: linear(gelu_tanh(x), weight, bias), the second half of GPT's MLP, saving only the
// pre-activation x (which GELU's own backward needs anyway) instead of x and gelu_tanh(x): the
// (B, T, 4C) GELU output lives as workspace for the product and is recomputed in backward (one
// element-wise pass): one of the two (B, T, 4C) tensors an MLP kept is gone.
// Built from the ops themselves under NoGradGuard, so every device, dtype and autocast rule of
// gelu_tanh and linear holds here unchanged; the values are the composition's bit for bit.
// Backward on the CPU in f32 / f64 makes the recomputed GELU output and dx in one pass that
// computes GELU's tanh once for both (gelu_tanh_t, the expression gelu_tanh and
// gelu_tanh_backward share), where the composition computes it twice.
#include "autograd/grad_mode.h"
#include "ops/autocast_policy.h"
#include "ops/bias_grad.h"
#include "ops/cpu_loops.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

// GELU of x as workspace memory (freed when the caller drops it).
Tensor gelu_workspace(const Tensor& x) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return gelu_tanh(x);
}

// One pass over da (the gradient at GELU's output) and x, same shape, contiguous, on the CPU:
// dx = gelu_tanh_backward(da, x) into a new tensor, and da overwritten by gelu_tanh(x) (the
// operand of dweight's product), both from one tanh per element. The bits of the two ops.
template <class T>
Tensor gelu_grad_and_recompute(const Tensor& da, const Tensor& x) {
  Tensor dx = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});  // (..., H)
  if (skip_kernel(dx)) return dx;
  T* pa = typed_base<T>(da);
  T* pd = typed_base<T>(dx);
  const T* px = typed_base<const T>(x);
  parallel_for(0, dx.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {  // vectorises: fn::tanh is branch-free for float
      const T xi = px[i], t = fn::gelu_tanh_t(xi);
      pd[i] = fn::gelu_tanh_grad_from_t(pa[i], xi, t);
      pa[i] = fn::gelu_tanh_from_t(xi, t);
    }
  });
  return dx;
}

// The CPU's fused backward; meta takes it too, so that a step on meta allocates what it
// allocates on cpu (the fused path's order of workspace and gradient differs from the
// composition's, and so can the peak).
bool fuses_gelu_backward(const Tensor& x) {
  const bool f32_or_f64 = x.dtype() == DType::f32 || x.dtype() == DType::f64;
  return (x.device().is_cpu() || x.is_meta()) && x.is_contiguous() && f32_or_f64;
}

class GeluLinearBackward : public Node {
 public:
  std::string_view name() const override { return "GeluLinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    NoGradGuard no_grad;
    Tensor xv = x.unpack();
    const int64_t out_features = g[0].size(-1), H = xv.size(-1);
    Tensor g2 = reshape(g[0], {-1, out_features});  // (R, out)
    Tensor dx, dweight, dbias;
    if (needs_input_grad(0) && needs_input_grad(1) && fuses_gelu_backward(xv)) {
      Tensor da;
      {
        MemoryCategoryGuard ws(MemoryCategory::workspace);
        da = reshape(matmul(g2, weight.unpack()), xv.shape());  // (..., H), then GELU's output
      }
      dx = xv.dtype() == DType::f32 ? gelu_grad_and_recompute<float>(da, xv)
                                    : gelu_grad_and_recompute<double>(da, xv);
      dweight = matmul(transpose(g2, 0, 1), reshape(da, {-1, H}));  // (out, H)
      if (needs_input_grad(2)) dbias = bias_grad(g2);               // (out)
      return {dx, dweight, dbias};
    }
    if (needs_input_grad(1)) {
      Tensor a = gelu_workspace(xv);                                          // (..., H) recomputed
      dweight = matmul(transpose(g2, 0, 1), reshape(a, {-1, H}));            // (out, H)
    }
    if (needs_input_grad(2)) dbias = bias_grad(g2);                            // (out)
    if (needs_input_grad(0)) {
      Tensor da;
      {
        MemoryCategoryGuard ws(MemoryCategory::workspace);
        da = reshape(matmul(g2, weight.unpack()), xv.shape());                 // (..., H)
      }
      dx = gelu_tanh_backward(da, xv);
    }
    return {dx, dweight, dbias};
  }
  SavedTensor x{this}, weight{this};
};

}  // namespace

Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast_wants_low({x, weight, bias}))
    return gelu_linear(autocast_low(x), autocast_low(weight), autocast_low(bias));
  check_defined("gelu_linear", x, "x");
  check_defined("gelu_linear", weight, "weight");
  Tensor out;
  {
    NoGradGuard no_grad;
    OpNameGuard name("gelu_linear");
    out = linear(gelu_workspace(x), weight, bias);  // the GELU output is dropped here
  }
  if (auto node = make_node_if_needed<GeluLinearBackward>({x, weight, bias})) {
    node->x.save(x);  // for GELU's derivative and, recomputed, for dweight
    if (x.requires_grad()) node->weight.save(weight);
    set_history(node, {x, weight, bias}, {out});
  }
  return out;
}

}  // namespace mg
