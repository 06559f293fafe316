// Autocast: a thread-local switch that makes the GEMM-shaped ops (matmul, linear, conv2d,
// attention) run in a 16-bit type (f16 or bf16) while softmax, norms, losses and reductions stay
// in f32. The state lives here (autograd/) so checkpointing can save and restore it; the casting
// rules are applied at each op's entry by ops/autocast_policy.h (Note [Autocast]).
#pragma once
#include "core/dtype.h"

namespace mg {

// Note [Autocast]: with autocast on, ops of the "low" list (matmul, linear, conv2d,
// scaled_dot_product_attention) cast their f32 (and other-16-bit) floating inputs to
// `dtype` and compute in it (the CPU accumulates in f32, rounding on store); ops of the "f32"
// list (softmax, log_softmax, layer_norm, cross_entropy, mse_loss, sum, mean, var) cast 16-bit
// inputs up to f32. batch_norm is mixed, as cuDNN's: it keeps a 16-bit input's dtype, computes
// its statistics and normalisation in f32 inside, and takes f32 weight and bias (16-bit ones
// are cast up), so a conv -> batch_norm -> relu6 chain runs without a single cast and saves
// 16-bit activations. Every cast is the differentiable mg::cast, so an f32 parameter
// used under autocast still gets an f32 gradient. f64 inputs are never touched. The engine turns
// autocast off while backward runs: backward functions see exactly the dtypes forward saved.
struct AutocastState {
  bool enabled = false;
  DType dtype = DType::bf16;  // f16 or bf16
};

AutocastState autocast_state();  // this thread's
// Throws mg::Error when enabling with a dtype other than f16 / bf16.
void set_autocast_state(AutocastState s);

// Sets the state for a scope and restores the previous one: AutocastGuard amp(DType::bf16);
// AutocastGuard off(DType::bf16, false) turns autocast off inside an autocast region.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, bool enabled = true);
  explicit AutocastGuard(AutocastState state) : AutocastGuard(state.dtype, state.enabled) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState prev_;
};

}  // namespace mg
