// Int8 depthwise convolution on the CPU (MobileNetV2's 3x3 per-channel convs): u8 activations with
// a zero point, s8 weights (symmetric, one scale per channel), products summed exactly in int32,
// then the same epilogue as the int8 GEMM (f32 per-channel scale, bias, clamp). Paths: AVX2 over
// 16 output columns at once for stride 1 (u8 widened to s16, (x - zx) * w fits in s16 exactly:
// 255 * 127 < 32767, then widened to s32 and summed), scalar for other strides.
// Every path is bit-identical to int8_depthwise_ref (padding contributes 0: it is the zero point).
#pragma once
#include <cstdint>

namespace mg {

// x: (N, C, H, W) u8 NCHW, w: (C, K, K) s8 -> (N, C, OH, OW), OH = (H + 2P - K) / S + 1 (same for W).
struct Int8DepthwiseShape {
  int64_t N = 1, C = 1, H = 1, W = 1, K = 3, stride = 1, padding = 1;
  int64_t OH() const { return (H + 2 * padding - K) / stride + 1; }
  int64_t OW() const { return (W + 2 * padding - K) / stride + 1; }
};

// Which path is compiled in ("AVX2 (s16 products, s32 sums)" or "scalar int32").
const char* int8_depthwise_path();

// The specification: out[n][c][oh][ow] = sum_{kh,kw} w[c][kh][kw] * (x[n][c][ih][iw] - zx), int32.
void int8_depthwise_ref(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w, int32_t* out);

// The fast path: int32 results (tests) or the f32 epilogue
//   y = min(max(fma(float(acc), scale[c], bias[c] or 0), clamp_lo), clamp_hi).
void int8_depthwise_i32(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w, int32_t* out);
void int8_depthwise_f32(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w,
                        const float* scale, const float* bias, float clamp_lo, float clamp_hi, float* y);

}  // namespace mg
