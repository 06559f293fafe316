// The casting rules of autocast (Note [Autocast] in autograd/autocast.h), applied as one line at
// the entry of each op concerned: the op re-enters itself with cast inputs, e.g.
//   if (autocast_wants_low({a, b})) return matmul(autocast_low(a), autocast_low(b));
//   if (autocast_wants_f32({x, w, b})) return layer_norm(autocast_f32(x), autocast_f32(w), ...);
// Casts are mg::cast (differentiable), so gradients flow back to the original dtypes. Also here:
// floating type promotion for binary element-wise ops under autocast (f32 + bf16 -> f32), where
// a low-precision branch meets an f32 residual stream.
#pragma once
#include <initializer_list>
#include <utility>

#include "autograd/autocast.h"
#include "core/tensor.h"

namespace mg {

// True when autocast is on and some defined input is floating, not f64 and not the autocast type.
bool autocast_wants_low(std::initializer_list<Tensor> inputs);
// t cast to the autocast type when autocast_wants_low({t}); t itself otherwise (undefined too).
Tensor autocast_low(const Tensor& t);
// True when autocast is on and some defined input is f16 or bf16.
bool autocast_wants_f32(std::initializer_list<Tensor> inputs);
// t cast to f32 when it is f16 / bf16 and autocast is on; t itself otherwise.
Tensor autocast_f32(const Tensor& t);

// Binary ops: true under autocast when a and b are floating, not f64, of different dtypes.
bool needs_float_promotion(const Tensor& a, const Tensor& b);
// (a, b) cast to the wider of their dtypes (f32 > f16, bf16; f16 with bf16 gives f32).
std::pair<Tensor, Tensor> promote_floating(const Tensor& a, const Tensor& b);

}  // namespace mg
