// gelu_linear: linear(gelu_tanh(x), weight, bias), the second half of GPT's MLP, saving only the
// pre-activation x (which GELU's own backward needs anyway) instead of x and gelu_tanh(x): the
// (B, T, 4C) GELU output lives as workspace for the product and is recomputed in backward (one
// element-wise pass): one of the two (B, T, 4C) tensors an MLP kept is gone.
// Built from the ops themselves under NoGradGuard, so every device, dtype and autocast rule of
// gelu_tanh and linear holds here unchanged; the values are the composition's bit for bit.
#include "autograd/grad_mode.h"
#include "ops/autocast_policy.h"
#include "ops/bias_grad.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

// GELU of x as workspace memory (freed when the caller drops it).
Tensor gelu_workspace(const Tensor& x) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return gelu_tanh(x);
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
