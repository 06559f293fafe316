// The direct depthwise convolution kernels behind conv2d (ops/conv2d_depthwise.cpp), and the
// switch that picks which of its CPU kernels runs: the plane-by-plane reference, or the
// channel-vectorised kernel at 16 lanes (AVX-512 zmm), 8 lanes (AVX2 ymm) or 1 lane (scalar).
// Every lane width gives the same bits; the output and dx also have the reference's (each lane
// repeats its operations in its order), dW its own order (within a bound of the reference's);
// tests force each one.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mg::detail {

// automatic: 16 lanes on an AVX-512 build, else 8, for planes the channel tiles hold.
enum class DepthwiseKernel { automatic, reference, scalar, lanes8, lanes16 };
void set_depthwise_kernel(DepthwiseKernel k);  // process-wide; for tests and benchmarks
DepthwiseKernel depthwise_kernel();

// A depthwise convolution's sizes: x (N, Cin, H, W), w (Cout, 1, KH, KW), Cout = Cin * mult.
struct DwGeom {
  int64_t N, Cin, H, W, Cout, KH, KW, OH, OW, stride, pad, mult;
  int64_t hw() const { return H * W; }
  int64_t ohw() const { return OH * OW; }
  int64_t kk() const { return KH * KW; }
};

// The channel-lane kernels (ops/conv2d_depthwise_lanes.cpp), on f32 data of `count` images:
// `lanes` channels at a time in vector lanes. The output and dx repeat the reference's operations
// in the reference's order in each lane (its bits); dW sums in its own fixed order (the same bits
// at every lane count). They take multiplier 1 and planes that fit their stack tiles;
// depthwise_lanes (output, dx) and depthwise_lanes_weight (dW) say whether they take g at that
// width.
bool depthwise_lanes(const DwGeom& g, int lanes);
// xs (count, Cin, H, W), w (Cout, KH*KW), bias (Cout) or null -> os (count, Cout, OH, OW).
void depthwise_lanes_forward(const DwGeom& g, int lanes, int64_t count, const float* xs, const float* w,
                             const float* bias, float* os);
// dos (count, Cout, OH, OW) -> dxs (count, Cin, H, W), the input gradient.
void depthwise_lanes_backward_input(const DwGeom& g, int lanes, int64_t count, const float* dos, const float* w,
                                    float* dxs);
bool depthwise_lanes_weight(const DwGeom& g, int lanes);
// dw (Cout, KH*KW) += the weight gradient of dos (count, Cout, OH, OW) and xs (count, Cin, H, W).
void depthwise_lanes_backward_weight(const DwGeom& g, int lanes, int64_t count, const float* dos,
                                     const float* xs, float* dw);

// x: (N, Cin, H, W), w: (Cin*M, 1, KH, KW), bias: (Cin*M) or undefined -> out (N, Cin*M, OH, OW).
// They allocate their workspace on every device (meta included) and compute only on cpu.
void depthwise_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                              int64_t stride, int64_t padding);
// dx (if defined) needs w; dw (if defined) needs x; undefined inputs are not read.
void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                               const Tensor& dw, int64_t stride, int64_t padding);

}  // namespace mg::detail
