// Adam / AdamW's element-wise update (see adam.h for the rule). The scalar factors (bias
// corrections, step size) are computed in f64 once per parameter, then the loop runs in the
// compute type, following PyTorch's order of operations so results agree to rounding.
#include "optim/adam.h"

#include <cmath>
#include <cstdio>

#include "ops/cuda/launchers.h"

namespace mg {

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions opt, bool decoupled)
    : Optimizer(std::move(name), std::move(groups)), opt_(opt), decoupled_(decoupled) {
  MG_CHECK(opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 && opt.beta2 < 1, type_name(), ": betas must be in [0, 1), got (",
           opt.beta1, ", ", opt.beta2, ")");
  MG_CHECK(opt.eps >= 0, type_name(), ": eps must be >= 0, got ", opt.eps);
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions opt) : Adam("Adam", std::move(groups), opt, false) {}

Adam::Adam(const NamedTensors& params, double lr, double weight_decay, AdamOptions opt)
    : Adam(std::vector<ParamGroup>{{.name = "", .params = params, .lr = lr, .weight_decay = weight_decay}}, opt) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions opt) : Adam("AdamW", std::move(groups), opt, true) {}

AdamW::AdamW(const NamedTensors& params, double lr, double weight_decay, AdamOptions opt)
    : AdamW(std::vector<ParamGroup>{{.name = "", .params = params, .lr = lr, .weight_decay = weight_decay}}, opt) {}

std::map<std::string, std::string> Adam::hyperparameters() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.17g", opt_.eps);
  return {{"beta1", std::to_string(opt_.beta1)}, {"beta2", std::to_string(opt_.beta2)}, {"eps", buf}};
}

void Adam::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) {
  const double lr = group.lr, wd = group.weight_decay;
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double t = double(s.step);
  const double bias_correction1 = 1 - std::pow(b1, t);
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(b2, t));
  const double step_size = lr / bias_correction1;
  const bool decoupled = decoupled_;
  const double eps = opt_.eps;
  if (param.device().is_cuda()) {  // the fused kernel, same order of operations
    const bool master = s.master.defined();
    cuda::adam_step(master ? s.master : param, grad, s.tensors[0].second, s.tensors[1].second,
                    master ? param : Tensor(), {lr, wd, b1, b2, eps, bias_correction1, bias_correction2_sqrt, decoupled});
    return;
  }
  for_each_chunk(param, grad, s, [&](auto* w, const auto* g, auto st, int64_t n) {
    using C = std::remove_pointer_t<decltype(w)>;
    const C c_decay = C(1 - lr * wd), c_wd = C(wd), c_1mb1 = C(1 - b1), c_b2 = C(b2), c_1mb2 = C(1 - b2);
    const C c_bc2 = C(bias_correction2_sqrt), c_eps = C(eps), c_step = C(step_size);
    C* m = st[0];
    C* v = st[1];
    for (int64_t i = 0; i < n; ++i) {
      C d = g[i];
      if (wd != 0) {
        if (decoupled) w[i] = w[i] * c_decay;
        else d = d + c_wd * w[i];
      }
      m[i] = m[i] + c_1mb1 * (d - m[i]);  // lerp(m, g, 1 - beta1), as PyTorch writes it
      v[i] = v[i] * c_b2 + c_1mb2 * d * d;
      const C denom = std::sqrt(v[i]) / c_bc2 + c_eps;
      w[i] = w[i] - c_step * (m[i] / denom);
    }
  });
}

}  // namespace mg
