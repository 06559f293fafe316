// The two conjugate communication ops of tensor parallelism (Megatron-LM's f and g), as autograd
// functions over device copies: `broadcast_to_devices` hands one tensor to every shard (forward:
// a copy per device; backward: the shards' gradients summed onto the source, one reduction) and
// `reduce_to_device` sums the shards' partial outputs onto one device (forward: one reduction;
// backward: the gradient copied to every shard). A sublayer is f -> local shard math -> g.
#pragma once
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace mg {

// f. x on any device -> one tensor per device of `devices` (x itself where it already lives, so a
// device pool holds no second copy). Backward: d x = sum_i d out_i, added in device order on x's
// device, so the sum's bits do not depend on which shard finished first.
std::vector<Tensor> broadcast_to_devices(const Tensor& x, const std::vector<Device>& devices);

// g. parts (same shape and dtype, any devices) -> sum_i parts[i] on `root`, added in order.
// Backward: d parts[i] = d out moved to parts[i]'s device.
Tensor reduce_to_device(const std::vector<Tensor>& parts, Device root);

}  // namespace mg
