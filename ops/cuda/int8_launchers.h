// Host entry points of the int8 inference kernels (ops/cuda/int8_gemm.cu, int8_depthwise.cu,
// quantize.cu) and of the fake quantization of training (fake_quantize.cu), apart from
// ops/cuda/launchers.h so only the quantization files depend on the int8 headers.
// Plain C++, declared in every build: ops/int8_gemm.cpp, ops/int8_depthwise.cpp, ops/quantize.cpp
// and ops/fake_quantize*.cpp call them where the data lives on cuda:N; a build without CUDA links
// ops/cuda_launcher_stub.cpp, whose versions throw "built without CUDA". Each kernel gives the
// CPU's bits: exact int32 sums, then the same MG_HOST_DEVICE epilogue (ops/int8_requant.h), or
// the same MG_HOST_DEVICE element math (ops/kernels/fake_quantize.h).
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/int8_depthwise.h"
#include "ops/int8_gemm.h"
#include "ops/kernels/fake_quantize.h"

namespace mg::cuda {

// Every pointer is memory of cuda:`device`; shapes, zero points and outputs checked by the caller
// as on the CPU.
// sums[m] = sum_k a[m * K + k] for the row-major (M, K) s8 matrix a.
void int8_row_sums(int device, const int8_t* a, int64_t M, int64_t K, int32_t* sums);
// C = a (M, K) . (B - b_zero) with out's epilogue; B u8 (b_u8) or, when b_u8 is null, f32 (b_f32)
// quantized on the way with quantize_u8(x, inv_scale, b_zero).
void int8_gemm(int device, int64_t M, int64_t N, int64_t K, const int8_t* a, const int32_t* row_sums,
               const uint8_t* b_u8, const float* b_f32, const Int8Layout& b_layout, float inv_scale, int32_t b_zero,
               const Int8GemmOut& out);
void int8_depthwise(int device, const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w,
                    const Int8DepthwiseOut& out);

// ops/quantize.h's element-wise ops on contiguous tensors of one cuda device (out allocated).
void quantize_per_tensor(const Tensor& out, const Tensor& x, float inv_scale, int32_t zero);  // x f32
void dequantize_per_tensor(const Tensor& out, const Tensor& q, float scale, int32_t zero);
void dequantize_per_channel(const Tensor& out, const Tensor& values, const Tensor& scales);

// ops/fake_quantize.h and ops/fake_quantize_learned.h (fake_quantize.cu): x, dout, scales contiguous
// f32 on one cuda device, outputs allocated by the op; mask (b8, like x) undefined when not wanted.
// out = fq::symmetric_s8(x, scales[c]) for x viewed as (C, numel / C), C = scales.numel().
void fake_quantize_per_channel(const Tensor& out, const Tensor& mask, const Tensor& x, const Tensor& scales);
// out = fq::affine_u8(x, scale, inv_scale, zero).
void fake_quantize_per_tensor(const Tensor& out, const Tensor& mask, const Tensor& x, float scale, float inv_scale,
                              int32_t zero);
// The LSQ backward for x, dout viewed as (C, numel / C), scales (C): dx (like x) and dscale (C), each
// f32 or undefined. dscale's partial sums per chunk of fq::kScaleGradChunk, added in a fixed order.
void fake_quantize_learned_backward(const Tensor& dx, const Tensor& dscale, const Tensor& x, const Tensor& dout,
                                    const Tensor& scales, fq::Grid q, fq::ScaleDivision division, double grad_factor);

}  // namespace mg::cuda
