// Tensor parallelism of a GPT's blocks (Megatron-LM, Shoeybi et al. 2019): each block's attention
// and MLP are cut across N devices, so every device holds 1/N of every block's projection
// weights. c_attn and c_fc are column-parallel (device d computes its own heads / its slice of
// the 4C hidden units from the whole input), c_proj is row-parallel (device d multiplies its
// slice of the inner dimension and yields a partial (B, T, C) output); the partials are summed on
// the first device, where the residual stream, the LayerNorms, the embeddings, the tied head and
// the c_proj biases stay. Per sublayer: one reduction forward (g: the partial outputs) and one
// backward (f: the input's gradients), parallel/shard_comm.h.
#pragma once
#include <vector>

#include "core/named_tensors.h"
#include "models/gpt.h"
#include "parallel/placement.h"

namespace mg {

// Errors, one message listing every problem: fewer than two devices, a device listed twice or
// not existing, a layer whose attention heads or MLP width do not divide by the device count.
void check_tensor_parallel(const GPT& gpt, const std::vector<Device>& devices);

// Moves wte, wpe, ln_f and every block's LayerNorms to devices[0] and replaces every block's attn
// and mlp by a tensor-parallel one holding slices of the same weights (so the model computes the
// same function). Parameter names become h.N.attn.shards.D.c_attn.weight, ...,
// h.N.attn.c_proj_bias; gather_tensor_parallel gives the single-device names back. Call with no
// graph alive and before building the optimizer. Returns the resolution with the shards as
// leaves (for per-device reports and out-of-memory messages).
ResolvedPlacement apply_tensor_parallel(GPT& gpt, const std::vector<Device>& devices);

// Whether apply_tensor_parallel converted this model.
bool is_tensor_parallel(const GPT& gpt);

// The model's parameters (or, with `grads`, their gradients) under the single-device names and
// shapes, the shards concatenated on `device`: for comparing with a single-device model and for
// loading into one (load_state_dict).
NamedTensors gather_tensor_parallel(const GPT& gpt, Device device, bool grads = false);

}  // namespace mg
