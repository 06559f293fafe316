// Module: the base of every layer and model. It owns named parameters (leaf tensors that require
// grad), buffers (state that is saved but not trained, e.g. BatchNorm's running statistics) and
// child modules, and walks them recursively with dotted names ("h.0.attn.weight") in
// registration order: for state_dict / load_state_dict / save / load, train/eval, moving to a
// device or dtype, zero_grad and counting. Modules are non-copyable and held by shared_ptr.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_category.h"
#include "core/named_tensors.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace mg {

// How a layer creates its parameters: which generator draws the initial values (the default
// generator when null), and where / in which dtype the tensors live. Building on kMeta allocates
// every byte (for memory estimates) and writes none, but still reserves the same generator
// positions, so a meta model and a cpu model built from one seed stay in step.
struct InitOptions {
  Generator* gen = nullptr;
  Device device = kCPU;
  DType dtype = DType::f32;
  Generator& generator() const { return gen ? *gen : default_generator(); }
};

// An uninitialised tensor allocated under MemoryCategory::parameter: how layers create their
// parameters and buffers.
Tensor parameter_empty(const Shape& shape, DType dtype, Device device);

// What a non-strict load_state_dict skipped (both empty after a strict load).
struct LoadResult {
  std::vector<std::string> missing_keys;     // in the model, not in the state dict
  std::vector<std::string> unexpected_keys;  // in the state dict, not in the model
};

// Pushes a module's name onto the profiler's module path for the duration of a forward.
class ForwardScope {
 public:
  explicit ForwardScope(const std::string& name) {
    if (!name.empty()) guard_.emplace(name);
  }

 private:
  std::optional<ModulePathGuard> guard_;
};

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "Linear", "Sequential", ...; and the name this module was registered under ("" at the top).
  const std::string& type_name() const { return type_name_; }
  const std::string& name() const { return name_; }

  // Registers `t` as a parameter and marks it requires_grad (it must be floating). The tensor is
  // detached from any graph; if it was not allocated under MemoryCategory::parameter it is copied
  // into a tensor that is, so parameter memory is always reported as such. Returns the
  // registered tensor: keep that handle (e.g. as a member), not the argument.
  Tensor register_parameter(const std::string& name, Tensor t);
  // A buffer: saved in the state dict, moved by to(), never trained. Same category rule.
  Tensor register_buffer(const std::string& name, Tensor t);
  // Adds a child; its parameters appear as "<name>.<param>". Returns the typed pointer.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // Recursive, dotted names, registration order (a module's own tensors before its children's).
  // A tensor registered twice (tied weights) is listed once, under the first name.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // This module first (name ""), then every descendant with its dotted path.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // Puts `m` in place of the child registered as `name` (same position, same name): how model
  // transformations (models/compress/) swap a layer for its quantized or folded form. Tensors
  // only the old child held are freed when the caller drops it.
  void replace_child(const std::string& name, std::shared_ptr<Module> m);
  // Direct children only.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves (or casts) every parameter and buffer in place: the TensorImpl each handle points to
  // gets the new storage, so members, optimizers and graphs that hold the handle see the change.
  // requires_grad is kept, a gradient is moved/cast with its parameter, integer buffers (e.g.
  // num_batches_tracked) keep their dtype under to(DType). Call it between steps, with no graph
  // alive and before creating the optimizer (which keeps its own state on the old device).
  Module& to(Device device);
  Module& to(DType dtype);

  // Parameters and buffers by dotted name (every name, tied ones included), detached aliases of
  // the module's tensors (no copy).
  NamedTensors state_dict() const;
  // Copies values into the existing tensors (no reallocation). Every key is checked before any
  // value is written; a shape or dtype mismatch is always an error naming the key and both
  // shapes; with strict, so is a missing or unexpected key.
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  LoadResult load_state_dict(const NamedTensors& state, bool strict = true);
  // The state dict as a safetensors file (metadata "format": "pt", readable by PyTorch).
  void save(const std::string& path) const;
  LoadResult load(const std::string& path, bool strict = true);

  // Drops every parameter's gradient (its memory returns to the allocator; PyTorch's set_to_none).
  void zero_grad();
  // Elements over all (distinct) parameters.
  int64_t num_parameters() const;

  // Model parallelism (parallel/placement.h): the device this module runs on. An owner that calls
  // it through UnaryModule::operator() has the input moved there first (a differentiable to(),
  // so the gradient crosses back); unset (the default), the input stays where it is.
  void set_input_device(std::optional<Device> d) { input_device_ = d; }
  const std::optional<Device>& input_device() const { return input_device_; }
  Tensor to_input_device(const Tensor& x) const;

  // Call at the start of forward: `auto scope = forward_scope();` so the profiler sees the module
  // path ("h.0.attn") of every allocation made inside. (Public so an owner that runs a
  // container's children itself, as checkpointing does, can push the container's name.)
  ForwardScope forward_scope() const { return ForwardScope(scope_name_); }

 protected:

  // The name pushed by forward_scope(). Containers without a forward of their own (ModuleList)
  // override this to give their children "<list name>.<index>".
  virtual void set_scope_name(const std::string& s) { scope_name_ = s; }
  static void set_scope_name_of(Module& m, const std::string& s) { m.set_scope_name(s); }
  const std::string& scope_name() const { return scope_name_; }
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  bool training_ = true;

 private:
  void collect(const std::string& prefix, NamedTensors& out, bool buffers, bool dedup) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out);
  void check_new_name(const std::string& name) const;
  void apply_to_tensors(std::optional<Device> device, std::optional<DType> dtype);

  std::string type_name_;
  std::string name_;
  std::string scope_name_;
  std::optional<Device> input_device_;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// A module with one tensor in and one tensor out: what Sequential chains. Owners call it as
// (*m)(x), which first moves x to the module's input_device() when one is set (model parallelism).
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(to_input_device(x)); }
};

// Evaluation mode for a scope: the module's train/eval flag comes back when the guard ends.
class EvalGuard {
 public:
  explicit EvalGuard(Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalGuard() { m_.train(was_training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  Module& m_;
  bool was_training_;
};

}  // namespace mg
