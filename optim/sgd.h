// SGD with momentum, dampening, Nesterov and (coupled) weight decay, exactly as PyTorch's
// torch.optim.SGD: g += wd * p; buf = g at the first step, else buf = momentum * buf +
// (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf; p -= lr * g.
#pragma once
#include "optim/optimizer.h"

namespace mg {

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SgdOptions opt = {});
  // One group with every parameter.
  SGD(const NamedTensors& params, double lr, double weight_decay = 0.0, SgdOptions opt = {});
  const SgdOptions& options() const { return opt_; }

 protected:
  // "momentum_buffer" when momentum != 0, nothing otherwise (plain SGD keeps no state tensors).
  std::vector<std::string> state_names() const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) override;
  std::map<std::string, std::string> hyperparameters() const override;

 private:
  SgdOptions opt_;
};

}  // namespace mg
