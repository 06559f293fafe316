// Module machinery: registration, recursive walks with dotted names, train/eval, in-place moves
// and casts, state dicts (checked before anything is written) and safetensors files.
#include "models/nn/module.h"

#include <functional>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"
#include "ops/ops.h"

namespace mg {
namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// A leaf tensor whose storage is tagged `category` (t itself when it already is one).
Tensor as_tagged_leaf(const Tensor& t, MemoryCategory category) {
  Tensor leaf = t.is_leaf() ? t : t.detach();
  if (leaf.storage()->category() == category || leaf.numel() == 0) return leaf;
  MemoryCategoryGuard guard(category);
  Tensor copy = empty(leaf.shape(), {.dtype = leaf.dtype(), .device = leaf.device()});
  copy_(copy, leaf);
  return copy;
}

// Points t's TensorImpl at a fresh copy of its data on `device` in `dtype` (see Module::to).
void retarget(const Tensor& t, Device device, DType dtype, MemoryCategory category) {
  if (t.device() == device && t.dtype() == dtype) return;
  NoGradGuard no_grad;
  MemoryCategoryGuard guard(category);
  Tensor moved = mg::to(cast(t.detach(), dtype), device);
  if (moved.storage() == t.storage()) moved = clone(moved);  // never alias the old storage
  TensorImpl* impl = t.impl();
  impl->storage = moved.storage();
  impl->offset = moved.storage_offset();
  impl->sizes = moved.shape();
  impl->strides = moved.strides();
  impl->dtype = moved.dtype();
}

std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << shape_str(t.shape()) << " " << t.dtype();
  return os.str();
}

}  // namespace

Tensor parameter_empty(const Shape& shape, DType dtype, Device device) {
  MemoryCategoryGuard guard(MemoryCategory::parameter);
  return empty(shape, {.dtype = dtype, .device = device});
}

void Module::check_new_name(const std::string& name) const {
  MG_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid member name '", name,
           "' (names must be non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list)
      if (n == name) return true;
    return false;
  };
  MG_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": the name '", name,
           "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(name);
  MG_CHECK(t.defined(), type_name_, ": parameter '", name, "' is an undefined tensor");
  MG_CHECK(is_floating(t.dtype()), type_name_, ": parameter '", name, "' must be floating, got ", t.dtype());
  Tensor p = as_tagged_leaf(t, MemoryCategory::parameter);
  p.set_requires_grad(true);
  params_.emplace_back(name, p);
  return p;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  MG_CHECK(t.defined(), type_name_, ": buffer '", name, "' is an undefined tensor");
  Tensor b = as_tagged_leaf(t, MemoryCategory::parameter);
  buffers_.emplace_back(name, b);
  return b;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  MG_CHECK(m != nullptr, type_name_, ": child module '", name, "' is null");
  MG_CHECK(m.get() != this, type_name_, ": a module cannot be its own child");
  m->name_ = name;
  m->set_scope_name(name);
  children_.emplace_back(name, std::move(m));
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> m) {
  MG_CHECK(m != nullptr, type_name_, ": replacement for child module '", name, "' is null");
  MG_CHECK(m.get() != this, type_name_, ": a module cannot be its own child");
  for (auto& [n, child] : children_) {
    if (n != name) continue;
    m->name_ = name;
    m->set_scope_name(child->scope_name_);
    child = std::move(m);
    return;
  }
  MG_THROW(type_name_, ": no child module named '", name, "' to replace");
}

// Walks params (or buffers) depth-first; with dedup a tensor registered twice is listed once.
void Module::collect(const std::string& prefix, NamedTensors& out, bool buffers, bool dedup) const {
  std::set<const TensorImpl*> seen;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& pre) {
    for (const auto& [n, t] : buffers ? m.buffers_ : m.params_) {
      if (dedup && !seen.insert(t.impl()).second) continue;
      out.emplace_back(join(pre, n), t);
    }
    for (const auto& [n, c] : m.children_) walk(*c, join(pre, n));
  };
  walk(*this, prefix);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out, /*buffers=*/false, /*dedup=*/true);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", out, /*buffers=*/true, /*dedup=*/true);
  return out;
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, this);
  for (auto& [n, c] : children_) c->collect_modules(join(prefix, n), out);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, c] : children_) c->train(on);
}

// Each tensor goes to `device` (or stays on its own when none is given, so a model split over
// devices stays split under to(DType)) in `dtype` (or its own).
void Module::apply_to_tensors(std::optional<Device> device, std::optional<DType> dtype) {
  std::set<const TensorImpl*> seen;
  for (auto& [_, m] : named_modules()) {
    for (const auto& [n, p] : m->params_) {
      if (!seen.insert(p.impl()).second) continue;
      Device dev = device.value_or(p.device());
      DType dt = dtype.value_or(p.dtype());
      if (p.grad().defined()) retarget(p.grad(), dev, dt, MemoryCategory::gradient);
      retarget(p, dev, dt, MemoryCategory::parameter);
    }
    for (const auto& [n, b] : m->buffers_) {
      if (!seen.insert(b.impl()).second) continue;
      // Integer buffers (counters, indices) keep their dtype when the module is cast.
      DType dt = dtype && is_floating(b.dtype()) ? *dtype : b.dtype();
      retarget(b, device.value_or(b.device()), dt, MemoryCategory::parameter);
    }
  }
}

Module& Module::to(Device device) {
  apply_to_tensors(device, std::nullopt);
  return *this;
}

Module& Module::to(DType dtype) {
  MG_CHECK(is_floating(dtype), type_name_, ".to: can only cast a module to a floating dtype, got ", dtype);
  apply_to_tensors(std::nullopt, dtype);
  return *this;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& pre) {
    for (const auto& [n, t] : m.params_) out.emplace_back(join(pre, n), t.detach());
    for (const auto& [n, t] : m.buffers_) out.emplace_back(join(pre, n), t.detach());
    for (const auto& [n, c] : m.children_) walk(*c, join(pre, n));
  };
  walk(*this, "");
  return out;
}

LoadResult Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  NamedTensors mine = state_dict();
  LoadResult result;
  std::vector<std::string> problems;
  std::set<std::string> known;
  for (const auto& [name, dst] : mine) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      result.missing_keys.push_back(name);
      if (strict) problems.push_back("missing key '" + name + "' (model has " + describe(dst) + ")");
      continue;
    }
    const Tensor& src = it->second;
    if (!src.defined()) {
      problems.push_back("key '" + name + "' is an undefined tensor in the state dict");
    } else if (src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
      problems.push_back("key '" + name + "': " + describe(src) + " in the state dict vs " + describe(dst) +
                         " in the model");
    }
  }
  for (const auto& [name, _] : state) {
    if (known.count(name)) continue;
    result.unexpected_keys.push_back(name);
    if (strict) problems.push_back("unexpected key '" + name + "'");
  }
  if (!problems.empty()) {
    std::string msg = type_name_ + ".load_state_dict: " + std::to_string(problems.size()) + " problem(s):";
    for (const auto& p : problems) msg += "\n  " + p;
    MG_THROW(msg);
  }
  // Everything checked: now write into the existing storage.
  NoGradGuard no_grad;
  for (const auto& [name, dst] : mine) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    Tensor src = it->second;
    if (src.device() != dst.device() && !src.is_contiguous()) src = contiguous(src.detach());
    copy_(dst, src);
  }
  return result;
}

LoadResult Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : state)
    MG_CHECK(m.emplace(n, t).second, type_name_, ".load_state_dict: the state dict has the key '", n, "' twice");
  return load_state_dict(m, strict);
}

void Module::save(const std::string& path) const {
  save_safetensors(path, state_dict(), {{"format", "pt"}});
}

LoadResult Module::load(const std::string& path, bool strict) {
  // Read straight onto the model's device when it has only one, else onto the host.
  NamedTensors mine = state_dict();
  Device device = mine.empty() ? kCPU : mine.front().second.device();
  for (const auto& [_, t] : mine)
    if (t.device() != device) device = kCPU;
  MemoryCategoryGuard guard(MemoryCategory::other);
  return load_state_dict(load_safetensors(path, device), strict);
}

Tensor Module::to_input_device(const Tensor& x) const {
  if (!input_device_ || !x.defined() || x.device() == *input_device_) return x;
  return mg::to(x, *input_device_);
}

void Module::zero_grad() {
  for (auto& [_, p] : named_parameters()) p.set_grad(Tensor());
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [_, p] : named_parameters()) n += p.numel();
  return n;
}

}  // namespace mg
