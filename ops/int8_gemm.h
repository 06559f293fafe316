// The int8 GEMM behind memgrad's quantized layers: C(M, N) = A(M, K) · (B(K, N) − zb) in int32,
// A signed 8-bit weights (symmetric per row = output channel), B unsigned 8-bit activations with a
// zero point, then an epilogue that writes int32 or requantizes to f32 (row scale, bias, clamp).
// Three paths chosen at run time (ops/int8_isa.h: the CPU's best, capped by MG_INT8_ISA), all exact
// in int32 (no saturation anywhere) and so bit-identical to int8_gemm_ref: AVX-512 VNNI (vpdpbusd
// on u8 x s8), AVX2 (both operands widened to s16 at packing, vpmaddwd: vpmaddubsw would saturate
// at 255*127*2 > 32767), and scalar. When A lives on cuda:N, the same entry points run the CUDA
// kernel of ops/cuda/int8_gemm.cu (__dp4a, the same epilogue functions), and every pointer given
// (B, the outputs, row_scale, bias) must then be that device's memory.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/tensor.h"
#include "ops/int8_requant.h"

namespace mg {

// Which path int8_isa() selects ("AVX-512 VNNI (vpdpbusd)", "AVX2 (vpmaddwd on s16)" or "scalar int32").
const char* int8_gemm_path();
// The path for tensors on cuda:N ("CUDA __dp4a tiled kernel (sm_61+)").
const char* int8_gemm_cuda_path();

// The specification every path is checked against: row-major with leading dimensions,
// C[m][n] = sum_k A[m][k] * (B[k][n] - b_zero).
void int8_gemm_ref(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda, const uint8_t* B, int64_t ldb,
                   int32_t b_zero, int32_t* C, int64_t ldc);

// Where column n and row m of a logical matrix live: columns come in groups of `group` (the pixels
// of one image), so element (row m, column n) is at
//   (n / group) * group_stride + (n % group) * col_stride + m * row_stride.
// A plain row-major (rows, cols) matrix with leading dimension ld: {group = cols, group_stride = 0,
// col_stride = 1, row_stride = ld}; NCHW activations as (C, N*HW): {HW, C*HW, 1, HW}; the
// transpose of a (rows=N, cols=K) matrix as (K, N): {1, K, 0, 1}.
struct Int8Layout {
  int64_t group = 1, group_stride = 0, col_stride = 1, row_stride = 0;
  MG_HOST_DEVICE int64_t offset(int64_t m, int64_t n) const {
    return (n / group) * group_stride + (n % group) * col_stride + m * row_stride;
  }
};

// A (M, K) s8 as the GEMM takes it: the weight tensor itself (row-major, no second copy: the
// GEMM repacks it into its tile layout, workspace, once per call) and its row sums, which fold
// B's zero point in. row_sums comes from the allocator under the current category.
struct Int8PackedA {
  Tensor data;      // (M, K) i8 contiguous, an alias of the argument of int8_pack_a
  Tensor row_sums;  // (M) i32: sum_k A[m][k]
  int64_t M = 0, K = 0;
};
// a: (M, K) i8 contiguous on a cpu or cuda device (row_sums on the same device). a must not change
// while the result is in use.
Int8PackedA int8_pack_a(const Tensor& a);

// What the epilogue writes for element (m, n) with the int32 value c (ops/int8_requant.h):
//   i32: c;   f32: min(max(fma(float(c), row_scale[m], bias[m] or 0), clamp_lo), clamp_hi);
//   u8: that f32 value quantized with out_inv_scale and out_zero (the next int8 layer's input).
struct Int8GemmOut {
  int32_t* i32 = nullptr;
  float* f32 = nullptr;
  uint8_t* u8 = nullptr;
  Int8Layout layout;                 // of the output (M, N)
  const float* row_scale = nullptr;  // (M), f32 output only
  const float* bias = nullptr;       // (M) or null
  float clamp_lo = -3.4e38f, clamp_hi = 3.4e38f;
  float out_inv_scale = 1.f;  // u8 output only
  int32_t out_zero = 0;
};

// C = A · (B − b_zero) with B given as u8 values (already quantized activations) or as f32
// values quantized on the fly while packing: q = clamp(nearbyint(x * inv_scale) + b_zero, 0, 255).
// The packed B (one panel per call) is workspace from `workspace_device`'s allocator.
void int8_gemm(const Int8PackedA& a, int64_t N, const uint8_t* b, const Int8Layout& b_layout, int32_t b_zero,
               const Int8GemmOut& out, Device workspace_device = kCPU);
void int8_gemm_quantize_b(const Int8PackedA& a, int64_t N, const float* b, const Int8Layout& b_layout,
                          float inv_scale, int32_t b_zero, const Int8GemmOut& out, Device workspace_device = kCPU);

}  // namespace mg
