// The quantize / dequantize op family: weights to int8 symmetric per output channel
// (q = round(w / s_c), s_c = max|w_c| / 127, q in [-127, 127]) and activations to u8 per tensor
// with a zero point (q = clamp(round(x / s) + z, 0, 255)), back to f32, and the choice of
// (scale, zero point) from an observed range. No autograd: these serve inference (PTQ). On meta
// the outputs are allocated and nothing is computed.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mg {

struct QuantizedChannels {
  Tensor values;  // i8, the weight's shape
  Tensor scales;  // (C) f32, C = the weight's first dimension
};

// w: (C, ...) floating -> values i8 (C, ...), scales (C). A channel of zeros gets scale 1.
QuantizedChannels quantize_per_channel(const Tensor& w);
// The same with given scales (C) f32, positive and finite (QAT's learned ones, models/compress/qat.h):
// values clamp(nearbyint(w / s_c), -127, 127), the rounding of fake_quantize_per_channel.
QuantizedChannels quantize_per_channel(const Tensor& w, const Tensor& scales);
// w: (C, ...) floating -> (C) f32: max_i |w[c, i]| / 127 (1 for a channel of zeros), the scales
// quantize_per_channel uses. Non-finite values are an error.
Tensor per_channel_scales(const Tensor& w);
// values i8 (C, ...), scales (C) f32 -> f32 (C, ...): values * scale_c.
Tensor dequantize_per_channel(const Tensor& values, const Tensor& scales);

// An activation quantization: real = scale * (q - zero_point), q in [0, 255].
struct ActivationQParams {
  float scale = 1.f;
  int32_t zero_point = 0;
};
// The range [lo, hi] widened to contain 0 (so zero padding and ReLU zeros are exact), mapped onto
// [0, 255]. Throws when lo > hi or either is not finite.
ActivationQParams choose_qparams_u8(float lo, float hi);

// x: floating, any shape -> u8 of the same shape (the rounding of ops/int8_requant.h's quantize_u8).
Tensor quantize_per_tensor(const Tensor& x, ActivationQParams q);
// q: u8 -> f32: scale * (q - zero_point).
Tensor dequantize_per_tensor(const Tensor& q, ActivationQParams p);

}  // namespace mg
