// The element math of fake quantization (ops/fake_quantize.h, ops/fake_quantize_learned.h), written
// once for the CPU loops and the CUDA kernels (ops/cuda/fake_quantize.cu), so both give the same
// bits: f32 only, every division and product rounded on its own (__fdiv_rn / __fmul_rn on the
// device, where nvcc would otherwise fuse a product into a following add), nearbyint on the host
// and rintf on the device (both round half to even). Also the chunk layout of the LSQ scale
// gradient's partial sums, which the two backends share.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/half.h"  // MG_HOST_DEVICE
#include "ops/int8_requant.h"

namespace mg::fq {

// The integer grid of one op: [qmin, qmax] with zero point z.
struct Grid {
  float qmin, qmax, zero;
};

// How x / s is computed, exactly as the forward (and the int8 layer after conversion) does it:
// per channel a division (quantize_per_channel), per tensor a product with 1 / s (quantize_u8).
enum class ScaleDivision { exact, by_inverse };

// Elements per partial sum of the LSQ scale gradient: a channel's elements in chunks of this many,
// each summed in f64, then the chunks of a channel added in index order (CPU and CUDA alike).
inline constexpr int64_t kScaleGradChunk = 1 << 14;

MG_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MG_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MG_HOST_DEVICE float round_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);
#endif
}

MG_HOST_DEVICE float scaled(float x, float s, float inv, ScaleDivision d) {
  return d == ScaleDivision::exact ? div_rn(x, s) : mul_rn(x, inv);
}

// fake_quantize_per_channel of one element (quantize_per_channel's arithmetic):
//   clamp(nearbyint(x / s), -127, 127) * s; inside: nearbyint(x / s) in [-127, 127] (the STE mask).
MG_HOST_DEVICE float symmetric_s8(float x, float s, bool& inside) {
  const float r = round_even(div_rn(x, s));
  inside = r >= -127.f && r <= 127.f;
  const float c = r < -127.f ? -127.f : (127.f < r ? 127.f : r);  // std::clamp(r, -127, 127)
  return mul_rn(float(int8_t(c)), s);
}

// fake_quantize_per_tensor of one element: quantize_u8, then dequantize_per_tensor's product;
// inside: nearbyint(x * inv) + zero in [0, 255].
MG_HOST_DEVICE float affine_u8(float x, float scale, float inv, int32_t zero, bool& inside) {
  const uint8_t u = quantize_u8(x, inv, zero);
  const float r = round_even(mul_rn(x, inv)) + float(zero);
  inside = r >= 0.f && r <= 255.f;
  return mul_rn(scale, float(int32_t(u) - zero));
}

// The LSQ backward of one element, with v = x / s and r = nearbyint(v) + z: inside as the forward's
// mask, and the returned coefficient of dout in the scale's gradient,
//   nearbyint(v) - v inside the range, qmin - z below it, qmax - z above it.
MG_HOST_DEVICE float lsq_coefficient(float x, float s, float inv, Grid q, ScaleDivision d, bool& inside) {
  const float v = scaled(x, s, inv, d);
  const float n = round_even(v), r = n + q.zero;
  inside = r >= q.qmin && r <= q.qmax;
  return inside ? n - v : r < q.qmin ? q.qmin - q.zero : q.qmax - q.zero;
}

}  // namespace mg::fq
