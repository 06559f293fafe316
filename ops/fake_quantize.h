// Fake quantization for quantization-aware training: quantize, then dequantize, in one autograd
// op, so the forward sees exactly the values the int8 model will compute with while the
// parameters stay f32. The rounding is not differentiable; backward is the straight-through
// estimator (Bengio et al. 2013, as PyTorch's fake_quantize_*): the gradient passes unchanged
// where the value was inside the representable range and is zero where it was clamped. The
// arithmetic is quantize_per_channel / quantize_per_tensor's (ops/quantize.h), so the forward is
// bit-identical to quantize -> dequantize. Scales are inputs (observed), not learned.
#pragma once
#include "core/tensor.h"
#include "ops/quantize.h"

namespace mg {

// w: (C, ...) floating, scales: (C) f32 positive -> w's shape and dtype:
//   clamp(nearbyint(w / s_c), -127, 127) * s_c; dw = dout where |nearbyint(w / s_c)| <= 127, else 0.
// With scales = per_channel_scales(w) nothing is clamped (the scale comes from the channel's max).
Tensor fake_quantize_per_channel(const Tensor& w, const Tensor& scales);

// x: floating, any shape -> x's shape and dtype:
//   (clamp(nearbyint(x / s) + z, 0, 255) - z) * s; dx = dout where the unclamped value was in [0, 255].
Tensor fake_quantize_per_tensor(const Tensor& x, ActivationQParams q);

}  // namespace mg
