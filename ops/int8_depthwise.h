// Int8 depthwise convolution on the CPU (MobileNetV2's 3x3 per-channel convs): u8 activations with
// a zero point, s8 weights (symmetric, one scale per channel), products summed exactly in int32,
// then ops/int8_requant.h's epilogue: f32 (per-channel scale, bias, clamp: a fused ReLU6) or u8 in
// the next layer's input quantization. Any stride, kernel size and padding. Paths, chosen at run
// time (ops/int8_isa.h): AVX-512 VNNI (vpdpwssd, 32 outputs at once), AVX2 (vpmaddwd, 16) and
// scalar; integer sums are exact, so every path is bit-identical to int8_depthwise_ref. On a cuda
// device the CUDA kernel of ops/cuda/int8_depthwise.cu runs, with the same epilogue functions.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "ops/int8_isa.h"
#include "ops/int8_requant.h"

namespace mg {

// x: (N, C, H, W) u8 NCHW, w: (C, K, K) s8 -> (N, C, OH, OW), OH = (H + 2P - K) / S + 1 (same for W).
struct Int8DepthwiseShape {
  int64_t N = 1, C = 1, H = 1, W = 1, K = 3, stride = 1, padding = 1;
  int64_t OH() const { return (H + 2 * padding - K) / stride + 1; }
  int64_t OW() const { return (W + 2 * padding - K) / stride + 1; }
};

// Which path int8_isa() selects ("AVX-512 VNNI (vpdpwssd)", "AVX2 (vpmaddwd)" or "scalar int32").
const char* int8_depthwise_path();

// The specification: out[n][c][oh][ow] = sum_{kh,kw} w[c][kh][kw] * (x[n][c][ih][iw] - zx), int32,
// padding read as zx (it contributes 0).
void int8_depthwise_ref(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w, int32_t* out);

// What the kernel writes: exactly one of i32 (the raw sums), f32 or u8 (Requant per channel c with
// scale[c], bias[c] or 0, and the clamp / output quantization of `q`).
struct Int8DepthwiseOut {
  int32_t* i32 = nullptr;
  float* f32 = nullptr;
  uint8_t* u8 = nullptr;
  const float* scale = nullptr;  // (C)
  const float* bias = nullptr;   // (C) or null
  Requant q{};                   // lo, hi, out_inv_scale, out_zero (its scale and bias are per channel)
};
// `device`: where every pointer (x, w, the output, scale, bias) lives; cuda:N runs on that GPU.
void int8_depthwise(const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w,
                    const Int8DepthwiseOut& out, Device device = kCPU);

}  // namespace mg
