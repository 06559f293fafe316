// Optimizer: the base of SGD, Adam and AdamW. It holds parameter groups (named parameters with
// their own lr and weight decay), allocates each parameter's state lazily at its first step under
// MemoryCategory::optimizer_state, runs the update in place on raw data under NoGradGuard (in
// parallel chunks whose bits do not depend on the thread count), bumps each parameter's version,
// and saves / loads its state as safetensors ("<param>.exp_avg", "<param>.step", ...) so a
// resumed run continues bit for bit. f16/bf16 parameters are updated through an f32 master copy
// kept in the state (Note [Master weights]).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "core/named_tensors.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace mg {

struct ParamGroup {
  std::string name;     // for reports ("decay", "no_decay"); may be empty
  NamedTensors params;  // names must be unique across all groups (they key the state)
  double lr = 1e-3;
  double weight_decay = 0.0;
  // set_lr(x) gives this group x * lr_scale, so a schedule keeps a group's ratio to the others
  // (QAT's learned scales at a fraction of the weights' rate: apps/quantize_command.cpp).
  double lr_scale = 1.0;
};

// Two groups from a model's named parameters: "decay" holds every parameter of rank >= 2
// (Linear/Conv2d weights, embeddings) with `weight_decay`; "no_decay" every parameter of rank < 2
// (biases, LayerNorm/BatchNorm weights), which are not decayed. The rule is the tensor's rank, so
// it holds for any model without naming its layers. Empty groups are left out.
std::vector<ParamGroup> weight_decay_groups(const NamedTensors& params, double lr, double weight_decay);

// One parameter's state: its step count and the optimizer's tensors (by default all of the
// parameter's shape, in the compute dtype: f64 for f64 parameters, f32 otherwise; an optimizer
// with another layout, e.g. AdamW8bit's quantized blocks, says so in state_specs).
struct ParamState {
  int64_t step = 0;
  NamedTensors tensors;  // in the order of Optimizer::state_names()
  Tensor master;         // f32 copy of an f16/bf16 parameter; undefined otherwise
};

// Note [Master weights]: a 16-bit parameter cannot absorb updates smaller than its rounding
// step (bf16 has 8 bits of mantissa), so the optimizer keeps an f32 copy, updates that, and
// rounds it into the parameter after every step. The copy is taken at the first step: load new
// values into such a parameter before its first step, or after load_state_dict of the optimizer.

class Optimizer {
 public:
  Optimizer(std::string type_name, std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient (parameters without one are skipped).
  void step();
  // Allocates the state of every parameter that has none yet (zeros, and the f32 master of a
  // 16-bit parameter), as its first step would. Training loops call it before the first forward,
  // so the state's bytes are part of the first step's peak, not a surprise inside its update.
  void allocate_state();
  // Drops every parameter's gradient (frees the memory; PyTorch's set_to_none).
  void zero_grad();
  // Runs `hook` at the end of every step(), in the order added (e.g. a pruning mask that keeps
  // removed weights at zero: models/compress/magnitude_prune.h).
  void add_post_step_hook(std::function<void()> hook) { post_step_hooks_.push_back(std::move(hook)); }

  double lr() const;  // the first group's
  void set_lr(double lr);  // every group's, times its lr_scale (what a schedule calls each step)
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  int64_t step_count() const { return step_count_; }  // step() calls so far
  const std::string& type_name() const { return type_name_; }
  // The state of a parameter by name (nullptr before its first step).
  const ParamState* state(const std::string& param_name) const;

  // "<param>.<state>" tensors, "<param>.master" and "<param>.step" (i64 scalars), detached
  // aliases of the live state; the metadata carries the type, step count and group settings.
  NamedTensors state_dict() const;
  std::map<std::string, std::string> state_metadata() const;
  // Replaces the whole state (and each group's lr and weight decay) after checking every entry:
  // an unknown parameter or state name, a wrong shape or dtype, or another optimizer's file is an
  // error naming the key.
  void load_state_dict(const NamedTensors& state, const std::map<std::string, std::string>& metadata);
  void save(const std::string& path) const;
  void load(const std::string& path);

 protected:
  // The per-parameter state tensors this optimizer keeps ("exp_avg", ...); at most kMaxStates.
  virtual std::vector<std::string> state_names() const = 0;
  // Name, shape and dtype of each state tensor of `param`, in order; created as zeros at the
  // first step and checked on load. Default: state_names(), each of param's shape in the
  // compute dtype.
  struct StateSpec {
    std::string name;
    Shape shape;
    DType dtype;
  };
  virtual std::vector<StateSpec> state_specs(const Tensor& param) const;
  // One parameter's update; s.step has already been incremented. Implementations call
  // for_each_chunk with their element-wise kernel.
  virtual void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) = 0;
  // Hyperparameters recorded in the saved metadata (informational).
  virtual std::map<std::string, std::string> hyperparameters() const { return {}; }

  static constexpr size_t kMaxStates = 3;
  // Runs kernel(w, g, st, n) over chunks of the parameter, where w is the working copy of the
  // weights (the parameter itself, or its f32 master), g the gradient in the compute type C and
  // st[k] the k-th state tensor, all pointing at the chunk start, n elements. After each chunk of
  // a 16-bit parameter the master is rounded into the parameter. Nothing runs on meta.
  template <typename Kernel>
  void for_each_chunk(const Tensor& param, const Tensor& grad, ParamState& s, Kernel&& kernel);

 private:
  ParamState& state_for(const Tensor& param, const std::string& name);

  std::string type_name_;
  std::vector<ParamGroup> groups_;
  std::map<std::string, ParamState> state_;
  int64_t step_count_ = 0;
  std::vector<std::function<void()>> post_step_hooks_;
};

template <typename Kernel>
void Optimizer::for_each_chunk(const Tensor& param, const Tensor& grad, ParamState& s, Kernel&& kernel) {
  if (param.is_meta() || param.numel() == 0) return;
  // Host pointers only: cuda:N parameters take the fused kernels (cuda::adam_step / sgd_step).
  MG_CHECK(param.device().is_cpu(), type_name_, ": the host update cannot run on ", param.device().str());
  MG_DISPATCH_FLOAT(param.dtype(), "optimizer step", [&] {
    using P = scalar_t;
    using C = compute_t<P>;
    constexpr bool low_precision = !std::is_same_v<P, C>;
    P* p = param.data<P>();
    const P* g = grad.data<P>();
    C* w = low_precision ? s.master.data<C>() : reinterpret_cast<C*>(p);  // identity cast for f32/f64
    std::array<C*, kMaxStates> st{};
    for (size_t k = 0; k < s.tensors.size(); ++k) st[k] = s.tensors[k].second.data<C>();
    parallel_for(0, param.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      auto at = [&](int64_t i) {
        std::array<C*, kMaxStates> o{};
        for (size_t k = 0; k < s.tensors.size(); ++k) o[k] = st[k] + i;
        return o;
      };
      if constexpr (!low_precision) {
        kernel(w + b, g + b, at(b), e - b);
      } else {
        constexpr int64_t kBlock = 256;  // the gradient in f32, a block at a time (on the stack)
        C gbuf[kBlock];
        for (int64_t i = b; i < e; i += kBlock) {
          const int64_t n = std::min(kBlock, e - i);
          for (int64_t j = 0; j < n; ++j) gbuf[j] = static_cast<C>(g[i + j]);
          kernel(w + i, static_cast<const C*>(gbuf), at(i), n);
          for (int64_t j = 0; j < n; ++j) p[i + j] = P(w[i + j]);
        }
      }
    });
  });
}

}  // namespace mg
