// GradScaler: dynamic loss scaling for fp16 training. fp16 gradients underflow below 2^-24, so
// the loss is multiplied by a large scale before backward and the gradients are divided by it
// again before the optimizer step. A step whose gradients hold an inf or NaN (the scale was too
// large) is skipped and the scale halved; after `growth_interval` good steps in a row the scale
// doubles again. Scale factors are powers of two, so scaling and unscaling are exact.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mg {

struct GradScalerOptions {
  double init_scale = 65536.0;   // 2^16, PyTorch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// A training step with it:
//   Tensor loss = ...;                 // under AutocastGuard amp(DType::f16)
//   backward(scaler.scale(loss));
//   scaler.unscale(opt);               // optional, before clip_grad_norm on true gradients
//   bool stepped = scaler.step(opt);   // unscale if not done, step or skip, update the scale
//   opt.zero_grad();
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions opt = {});

  // loss * scale (differentiable, in loss's dtype).
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of opt's parameters by the scale, in place, once per step (a second
  // call before step() does nothing); returns whether every gradient is finite.
  bool unscale(Optimizer& opt);
  // Unscales (if not done), runs opt.step() when every gradient is finite and skips it otherwise,
  // then updates the scale. Returns whether the optimizer stepped.
  bool step(Optimizer& opt);

  double scale_value() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // good steps since the last change
  int64_t skipped_steps() const { return skipped_; }           // steps skipped so far
  const GradScalerOptions& options() const { return opt_; }

  // {"scale", "growth_tracker", "skipped_steps", "growth_factor", "backoff_factor",
  //  "growth_interval"}: what a checkpoint saves; load_state checks every field and its type.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

 private:
  void update(bool found_inf);

  GradScalerOptions opt_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
  bool unscaled_ = false;  // unscale() ran for the current step
  bool found_inf_ = false;
};

}  // namespace mg
