// Adam and AdamW as PyTorch computes them (amsgrad off). With t the parameter's step count:
//   Adam:  g += wd * p (coupled decay)          AdamW: p *= 1 - lr * wd (decoupled decay)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State per parameter: exp_avg (m) and exp_avg_sq (v), plus the f32 master of 16-bit weights.
#pragma once
#include "optim/optimizer.h"

namespace mg {

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, AdamOptions opt = {});
  // One group with every parameter.
  Adam(const NamedTensors& params, double lr, double weight_decay = 0.0, AdamOptions opt = {});
  const AdamOptions& options() const { return opt_; }

 protected:
  Adam(std::string type_name, std::vector<ParamGroup> groups, AdamOptions opt, bool decoupled);
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) override;
  std::map<std::string, std::string> hyperparameters() const override;

 private:
  AdamOptions opt_;
  bool decoupled_;  // AdamW: decay the weights directly instead of adding wd * p to the gradient
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamOptions opt = {});
  // One group with every parameter (PyTorch's default weight decay 0.01). For the usual
  // "no decay on biases and norms", pass weight_decay_groups(params, lr, wd) instead.
  AdamW(const NamedTensors& params, double lr, double weight_decay = 0.01, AdamOptions opt = {});
};

}  // namespace mg
