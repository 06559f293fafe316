// Optimizer base: parameter groups, lazy state, the step loop (checks, master copies, version
// bumps) and the state file. The update arithmetic lives in sgd.cpp and adam.cpp.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "autograd/grad_mode.h"
#include "core/cuda/backend.h"
#include "core/memory_category.h"
#include "core/safetensors.h"
#include "ops/ops.h"

namespace mg {
namespace {

// f64 parameters keep f64 state; every other floating dtype keeps f32.
DType state_dtype(DType param) { return param == DType::f64 ? DType::f64 : DType::f32; }
bool needs_master(DType param) { return param == DType::f16 || param == DType::bf16; }

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips exactly
  return buf;
}

}  // namespace

std::vector<ParamGroup> weight_decay_groups(const NamedTensors& params, double lr, double weight_decay) {
  ParamGroup decay{.name = "decay", .params = {}, .lr = lr, .weight_decay = weight_decay};
  ParamGroup no_decay{.name = "no_decay", .params = {}, .lr = lr, .weight_decay = 0.0};
  for (const auto& [n, p] : params) (p.dim() >= 2 ? decay : no_decay).params.emplace_back(n, p);
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::string type_name, std::vector<ParamGroup> groups)
    : type_name_(std::move(type_name)), groups_(std::move(groups)) {
  std::set<std::string> names;
  std::set<const TensorImpl*> tensors;
  for (const auto& g : groups_) {
    MG_CHECK(g.lr >= 0 && g.weight_decay >= 0, type_name_, ": group '", g.name, "' has lr ", g.lr,
             " and weight_decay ", g.weight_decay, " (both must be >= 0)");
    MG_CHECK(g.lr_scale > 0 && std::isfinite(g.lr_scale), type_name_, ": group '", g.name, "' has lr_scale ",
             g.lr_scale, " (it must be positive and finite)");
    for (const auto& [n, p] : g.params) {
      MG_CHECK(p.defined(), type_name_, ": parameter '", n, "' is an undefined tensor");
      MG_CHECK(is_floating(p.dtype()), type_name_, ": parameter '", n, "' has dtype ", p.dtype(),
               "; only floating parameters can be optimised");
      MG_CHECK(p.is_leaf() && p.is_contiguous(), type_name_, ": parameter '", n,
               "' must be a contiguous leaf tensor (a registered module parameter)");
      MG_CHECK(names.insert(n).second, type_name_, ": two parameters are named '", n, "'");
      MG_CHECK(tensors.insert(p.impl()).second, type_name_, ": parameter '", n,
               "' is listed twice (under another name too); a tied weight must appear once");
    }
  }
}

double Optimizer::lr() const {
  MG_CHECK(!groups_.empty(), type_name_, ": no parameter groups");
  return groups_.front().lr;
}

void Optimizer::set_lr(double lr) {
  MG_CHECK(lr >= 0, type_name_, ".set_lr: lr must be >= 0, got ", lr);
  for (auto& g : groups_) g.lr = lr * g.lr_scale;
}

const ParamState* Optimizer::state(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? nullptr : &it->second;
}

std::vector<Optimizer::StateSpec> Optimizer::state_specs(const Tensor& param) const {
  std::vector<StateSpec> specs;
  for (const auto& n : state_names()) specs.push_back({n, param.shape(), state_dtype(param.dtype())});
  return specs;
}

ParamState& Optimizer::state_for(const Tensor& param, const std::string& name) {
  auto it = state_.find(name);
  if (it != state_.end()) return it->second;
  // Lazily, at the parameter's first step: the state is zeros, the master a copy of the weights.
  MemoryCategoryGuard guard(MemoryCategory::optimizer_state);
  ParamState s;
  const TensorOptions opt{.dtype = state_dtype(param.dtype()), .device = param.device()};
  for (const auto& spec : state_specs(param))
    s.tensors.emplace_back(spec.name, zeros(spec.shape, {.dtype = spec.dtype, .device = param.device()}));
  if (needs_master(param.dtype())) {
    s.master = empty(param.shape(), opt);
    copy_(s.master, param);
  }
  return state_.emplace(name, std::move(s)).first->second;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  // Every state is allocated before any parameter changes: a budget too small for the state
  // raises OutOfMemoryError with all parameters still at their old values (no half-done step).
  for (const auto& group : groups_)
    for (const auto& [name, p] : group.params)
      if (p.grad().defined()) state_for(p, name);
  for (const auto& group : groups_) {
    for (const auto& [name, p] : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      MG_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(), type_name_,
               ": gradient of '", name, "' is ", shape_str(grad.shape()), " ", grad.dtype(), " on ",
               grad.device().str(), " but the parameter is ", shape_str(p.shape()), " ", p.dtype(), " on ",
               p.device().str());
      MG_CHECK(p.device().is_cpu() || p.is_meta() || (p.device().is_cuda() && cuda::is_built()), type_name_,
               ": no kernel for device ", p.device().str());
      if (!grad.is_contiguous()) {
        MemoryCategoryGuard ws(MemoryCategory::workspace);
        grad = contiguous(grad.detach());
      }
      ParamState& s = state_for(p, name);
      s.step += 1;
      update(group, p, grad, s);
      p.bump_version();
    }
  }
  step_count_ += 1;
  for (const auto& hook : post_step_hooks_) hook();
}

void Optimizer::allocate_state() {
  NoGradGuard no_grad;
  for (const auto& group : groups_)
    for (const auto& [name, p] : group.params) state_for(p, name);
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& [_, p] : g.params) p.set_grad(Tensor());
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  for (const auto& g : groups_) {
    for (const auto& [name, p] : g.params) {
      auto it = state_.find(name);
      if (it == state_.end()) continue;
      const ParamState& s = it->second;
      {
        MemoryCategoryGuard guard(MemoryCategory::optimizer_state);
        out.emplace_back(name + ".step", scalar_tensor(double(s.step), {.dtype = DType::i64}));
      }
      for (const auto& [sn, t] : s.tensors) out.emplace_back(name + "." + sn, t.detach());
      if (s.master.defined()) out.emplace_back(name + ".master", s.master.detach());
    }
  }
  return out;
}

std::map<std::string, std::string> Optimizer::state_metadata() const {
  std::map<std::string, std::string> meta = hyperparameters();
  meta["optimizer"] = type_name_;
  meta["step_count"] = std::to_string(step_count_);
  meta["num_groups"] = std::to_string(groups_.size());
  for (size_t i = 0; i < groups_.size(); ++i) {
    const std::string k = "group." + std::to_string(i) + ".";
    meta[k + "name"] = groups_[i].name;
    meta[k + "lr"] = fmt_double(groups_[i].lr);
    meta[k + "weight_decay"] = fmt_double(groups_[i].weight_decay);
    meta[k + "lr_scale"] = fmt_double(groups_[i].lr_scale);
    meta[k + "num_params"] = std::to_string(groups_[i].params.size());
  }
  return meta;
}

void Optimizer::load_state_dict(const NamedTensors& state, const std::map<std::string, std::string>& meta) {
  const std::string where = type_name_ + ".load_state_dict: ";
  auto get = [&](const std::string& key) {
    auto it = meta.find(key);
    MG_CHECK(it != meta.end(), where, "metadata has no '", key, "' entry (not an optimizer state file?)");
    return it->second;
  };
  MG_CHECK(get("optimizer") == type_name_, where, "the state was saved by ", get("optimizer"), ", not ", type_name_);
  MG_CHECK(get("num_groups") == std::to_string(groups_.size()), where, "the state has ", get("num_groups"),
           " parameter groups, this optimizer ", groups_.size());
  for (size_t i = 0; i < groups_.size(); ++i)
    MG_CHECK(get("group." + std::to_string(i) + ".num_params") == std::to_string(groups_[i].params.size()), where,
             "group ", i, " has ", get("group." + std::to_string(i) + ".num_params"), " parameters in the state, ",
             groups_[i].params.size(), " here");

  // Every parameter by name, and the fields each state entry may have.
  std::map<std::string, Tensor> params;
  for (const auto& g : groups_)
    for (const auto& [n, p] : g.params) params.emplace(n, p);
  std::map<std::string, ParamState> fresh;
  for (const auto& [key, t] : state) {
    size_t dot = key.rfind('.');
    MG_CHECK(dot != std::string::npos && params.count(key.substr(0, dot)), where, "key '", key,
             "' names no parameter of this optimizer");
    const std::string pname = key.substr(0, dot), field = key.substr(dot + 1);
    const Tensor& p = params.at(pname);
    ParamState& s = fresh[pname];
    if (field == "step") {
      MG_CHECK(t.numel() == 1 && !is_floating(t.dtype()), where, "key '", key, "' must be an integer scalar, got ",
               shape_str(t.shape()), " ", t.dtype());
      s.step = t.item<int64_t>();
      continue;
    }
    const bool is_master = field == "master";
    const std::vector<StateSpec> specs = state_specs(p);
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& sp) { return sp.name == field; });
    const bool known = is_master ? needs_master(p.dtype()) : spec != specs.end();
    MG_CHECK(known, where, "key '", key, "': '", field, "' is not a state of ", type_name_, " for a ", p.dtype(),
             " parameter of shape ", shape_str(p.shape()));
    const DType want = is_master ? state_dtype(p.dtype()) : spec->dtype;
    const Shape want_shape = is_master ? p.shape() : spec->shape;
    MG_CHECK(t.shape() == want_shape && t.dtype() == want, where, "key '", key, "': ", shape_str(t.shape()), " ",
             t.dtype(), " in the state vs ", shape_str(want_shape), " ", want, " expected");
    // Use the loaded tensor as the state when it already lives where the state must; else copy.
    Tensor dst = t;
    if (t.device() != p.device() || !t.is_contiguous() || t.storage()->category() != MemoryCategory::optimizer_state) {
      MemoryCategoryGuard guard(MemoryCategory::optimizer_state);
      dst = empty(want_shape, {.dtype = want, .device = p.device()});
      copy_(dst, t.device() == p.device() || t.is_contiguous() ? t : contiguous(t));
    }
    if (is_master) s.master = dst;
    else s.tensors.emplace_back(field, dst);
  }
  // Complete entries only, with the tensors in state_names() order.
  for (auto& [pname, s] : fresh) {
    std::vector<std::string> names;
    for (const auto& sp : state_specs(params.at(pname))) names.push_back(sp.name);
    MG_CHECK(s.tensors.size() == names.size() && s.master.defined() == needs_master(params.at(pname).dtype()),
             where, "the state of '", pname, "' is incomplete (", s.tensors.size(), " of ", names.size(),
             " tensors", needs_master(params.at(pname).dtype()) && !s.master.defined() ? ", no master copy" : "", ")");
    NamedTensors ordered;
    for (const auto& n : names)
      for (auto& e : s.tensors)
        if (e.first == n) ordered.push_back(e);
    s.tensors = std::move(ordered);
    MG_CHECK(s.step > 0, where, "the state of '", pname, "' has no step count");
  }
  state_ = std::move(fresh);
  step_count_ = std::stoll(get("step_count"));
  for (size_t i = 0; i < groups_.size(); ++i) {
    groups_[i].lr = std::stod(get("group." + std::to_string(i) + ".lr"));
    groups_[i].weight_decay = std::stod(get("group." + std::to_string(i) + ".weight_decay"));
    // Files from before lr_scale existed keep the group's own (1 then).
    if (auto it = meta.find("group." + std::to_string(i) + ".lr_scale"); it != meta.end())
      groups_[i].lr_scale = std::stod(it->second);
  }
}

void Optimizer::save(const std::string& path) const { save_safetensors(path, state_dict(), state_metadata()); }

void Optimizer::load(const std::string& path) {
  // Straight onto the parameters' device when they share one (no host copy on the way).
  Device device = kCPU;
  bool first = true;
  for (const auto& g : groups_)
    for (const auto& [_, p] : g.params) {
      if (first) device = p.device();
      else if (p.device() != device) device = kCPU;
      first = false;
    }
  std::map<std::string, std::string> meta = load_safetensors_metadata(path);
  MemoryCategoryGuard guard(MemoryCategory::optimizer_state);
  load_state_dict(load_safetensors(path, device), meta);
}

}  // namespace mg
