// SGD's element-wise update (see sgd.h for the rule); state: one momentum buffer per parameter.
#include "optim/sgd.h"

#include "ops/cuda/launchers.h"

namespace mg {

SGD::SGD(std::vector<ParamGroup> groups, SgdOptions opt) : Optimizer("SGD", std::move(groups)), opt_(opt) {
  MG_CHECK(opt.momentum >= 0 && opt.dampening >= 0, "SGD: momentum ", opt.momentum, " and dampening ",
           opt.dampening, " must be >= 0");
  MG_CHECK(!opt.nesterov || (opt.momentum > 0 && opt.dampening == 0),
           "SGD: Nesterov momentum requires momentum > 0 and dampening = 0, got momentum ", opt.momentum,
           ", dampening ", opt.dampening);
}

SGD::SGD(const NamedTensors& params, double lr, double weight_decay, SgdOptions opt)
    : SGD(std::vector<ParamGroup>{{.name = "", .params = params, .lr = lr, .weight_decay = weight_decay}}, opt) {}

std::vector<std::string> SGD::state_names() const {
  if (opt_.momentum == 0) return {};
  return {"momentum_buffer"};
}

std::map<std::string, std::string> SGD::hyperparameters() const {
  return {{"momentum", std::to_string(opt_.momentum)},
          {"dampening", std::to_string(opt_.dampening)},
          {"nesterov", opt_.nesterov ? "true" : "false"}};
}

void SGD::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) {
  const double lr = group.lr, wd = group.weight_decay;
  const double momentum = opt_.momentum, dampening = opt_.dampening;
  const bool nesterov = opt_.nesterov, first = s.step == 1;
  if (param.device().is_cuda()) {  // the fused kernel, same order of operations
    const bool master = s.master.defined();
    cuda::sgd_step(master ? s.master : param, grad, s.tensors.empty() ? Tensor() : s.tensors[0].second,
                   master ? param : Tensor(), {lr, wd, momentum, dampening, nesterov, first});
    return;
  }
  for_each_chunk(param, grad, s, [&](auto* w, const auto* g, auto st, int64_t n) {
    using C = std::remove_pointer_t<decltype(w)>;
    const C c_wd = C(wd), c_mom = C(momentum), c_damp = C(1 - dampening), c_lr = C(lr);
    C* buf = st[0];
    for (int64_t i = 0; i < n; ++i) {
      C d = g[i];
      if (wd != 0) d = d + c_wd * w[i];
      if (momentum != 0) {
        // PyTorch starts the buffer as a copy of the first gradient (no dampening applied).
        buf[i] = first ? d : c_mom * buf[i] + c_damp * d;
        d = nesterov ? d + c_mom * buf[i] : buf[i];
      }
      w[i] = w[i] - c_lr * d;
    }
  });
}

}  // namespace mg
