// Containers: Sequential chains UnaryModules; ModuleList only holds and names its elements.
#include "models/nn/layers.h"

namespace mg {

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> layers) : UnaryModule("Sequential") {
  for (auto& m : layers) push_back(std::move(m));
}

const std::shared_ptr<UnaryModule>& Sequential::operator[](size_t i) const {
  MG_CHECK(i < layers_.size(), "Sequential: index ", i, " out of range for ", layers_.size(), " layers");
  return layers_[i];
}

void Sequential::replace(size_t i, std::shared_ptr<UnaryModule> m) {
  MG_CHECK(i < layers_.size(), "Sequential::replace: index ", i, " out of range for ", layers_.size(), " layers");
  replace_child(std::to_string(i), m);
  layers_[i] = std::move(m);
}

Tensor Sequential::forward(const Tensor& x) {
  auto scope = forward_scope();
  Tensor h = x;
  for (auto& layer : layers_) h = (*layer)(h);  // operator(): moves h where a placed layer runs
  return h;
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  MG_CHECK(i < modules_.size(), "ModuleList: index ", i, " out of range for ", modules_.size(), " modules");
  return modules_[i];
}

std::string ModuleList::element_scope(size_t i) const {
  return scope_name().empty() ? std::to_string(i) : scope_name() + "." + std::to_string(i);
}

// The list's own name never reaches the module path (it has no forward), so it is folded into
// its elements' scope names instead.
void ModuleList::set_scope_name(const std::string& s) {
  Module::set_scope_name(s);
  for (size_t i = 0; i < modules_.size(); ++i) set_scope_name_of(*modules_[i], element_scope(i));
}

}  // namespace mg
