// Fake quantization with a learned scale (LSQ: Esser et al. 2019, "Learned Step Size
// Quantization"; PyTorch's _fake_quantize_learnable_per_{tensor,channel}_affine). The forward is
// ops/fake_quantize.h's, bit for bit; the scale is an input that gets a gradient too, so the
// optimizer moves each quantization step to where rounding plus clamping hurt the loss least.
// With v = x / s and r = nearbyint(v) + z (the integer before clamping):
//   dx = dout where qmin <= r <= qmax, else 0 (straight-through, as fake_quantize_*);
//   ds = sum over the tensor (per tensor) or the channel (per channel) of dout * g, times grad_factor,
//        g = nearbyint(v) - v inside the range, qmin - z below it, qmax - z above it.
// grad_factor is LSQ's gradient scale 1 / sqrt(N * qmax), N the elements per scale, which keeps the
// scale's step in proportion to its size; the caller passes it. The zero point is fixed (not learned,
// no gradient): learning it is PyTorch's option, not LSQ's. Not differentiable twice.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mg {

// x: floating, any shape; scale: (1) f32 positive, requires grad or not -> x's shape and dtype:
//   (clamp(nearbyint(x / s) + z, 0, 255) - z) * s, fake_quantize_per_tensor's u8 grid and arithmetic.
// PyTorch: _fake_quantize_learnable_per_tensor_affine(x, scale, z, 0, 255, grad_factor).
Tensor fake_quantize_learned_per_tensor(const Tensor& x, const Tensor& scale, int32_t zero_point, double grad_factor);

// w: (C, ...) floating; scales: (C) f32 positive -> w's shape and dtype:
//   clamp(nearbyint(w / s_c), -127, 127) * s_c, fake_quantize_per_channel's symmetric int8 grid.
// PyTorch: _fake_quantize_learnable_per_channel_affine(w, scales, zeros, 0, -127, 127, grad_factor)
// (which multiplies by 1 / s where this divides, as quantize_per_channel: equal but at exact ties).
Tensor fake_quantize_learned_per_channel(const Tensor& w, const Tensor& scales, double grad_factor);

}  // namespace mg
