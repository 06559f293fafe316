// Gradient clipping by global norm (PyTorch's clip_grad_norm_): the L2 norm over every
// parameter's gradient, summed in f64 in an order fixed by the shapes (so the value does not
// depend on the thread count); when it exceeds max_norm every gradient is scaled by
// max_norm / (norm + 1e-6).
#pragma once
#include <functional>
#include <vector>

#include "core/named_tensors.h"

namespace mg {

// Returns the total norm before clipping. Parameters without a gradient are skipped. A NaN or
// infinite norm is returned as it is and the gradients are left untouched, so the caller sees
// the overflow and can skip the step (scaling by NaN would silently destroy every gradient).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
double clip_grad_norm(const NamedTensors& params, double max_norm);
// The same over a shard of the gradients: sum_sq_across turns this rank's sum of squares into
// the sum over every shard (data-parallel ZeRO), so every rank clips by the global norm.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm,
                      const std::function<double(double)>& sum_sq_across);
// The same norm, without clipping.
double grad_norm(const std::vector<Tensor>& params);

}  // namespace mg
