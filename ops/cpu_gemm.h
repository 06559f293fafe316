// The CPU GEMM every matrix product goes through (matmul, linear, conv2d's im2col, attention):
// C = alpha * op(A) * op(B) + beta * C on row-major matrices with leading dimensions, where
// op(X) is X or X^T. One entry point so the backend choice is made once: f32 runs memgrad's packed
// GEMM (ops/cpu_gemm_packed.h: AVX-512, AVX2 or scalar micro-kernels, Eigen's bits), f64 Eigen's.
// f16/bf16 operands are converted to f32 tile by tile inside the product (never as whole tensors).
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/half.h"

namespace mg {

enum class Transpose : bool { no = false, yes = true };

// A: (M, K) (or (K, M) when transposed), B: (K, N) (or (N, K)), C: (M, N).
void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
              int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// C = alpha * op(A) * op(B) + bias, bias (N) added to every row of C: the bits of filling C's
// rows with the bias and calling cpu_gemm with beta = 1 (linear's forward), without the pass that
// writes the bias into C first. C is not read.
void cpu_gemm_bias(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, const float* bias, float* C, int64_t ldc);

// 16-bit operands and result (Half or BFloat16) with f32 accumulation: each tile of C converts
// its panel of op(A) (rows x K), of op(B) (K x cols) and its block of C into f32, multiplies in
// f32 and rounds its C block on store. The panels live in `workspace`, the caller's
// cpu_gemm_workspace_floats(M, N, K) floats: a fixed number of lanes of one tile each, decided by
// the shapes alone, so an op allocates it from the allocator (on meta too) before its kernel.
int64_t cpu_gemm_workspace_floats(int64_t M, int64_t N, int64_t K);
void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A,
              int64_t lda, const BFloat16* B, int64_t ldb, float beta, BFloat16* C, int64_t ldc, float* workspace);
void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const Half* A, int64_t lda,
              const Half* B, int64_t ldb, float beta, Half* C, int64_t ldc, float* workspace);

// Which library serves cpu_gemm (the f32 kernel in use, and Eigen for f64), for `memgrad info`.
const char* cpu_gemm_backend();

// The f32 products' kernel: memgrad's packed GEMM with AVX-512, AVX2 or plain C++ micro-kernels,
// or Eigen's GEMM (what memgrad used before; kept for comparison). All give the same bits.
// The default is the fastest this CPU runs; MG_GEMM_KERNEL=avx512|avx2|scalar|eigen overrides it
// at start-up. Tests and benchmarks switch with set_cpu_gemm_kernel (an error if the CPU lacks it).
enum class GemmKernel : uint8_t { eigen, scalar, avx2, avx512 };
const char* gemm_kernel_name(GemmKernel k);  // "avx512", ...
bool cpu_gemm_kernel_supported(GemmKernel k);
GemmKernel cpu_gemm_kernel();
void set_cpu_gemm_kernel(GemmKernel k);

// Whether bf16 products run on AVX512-BF16's vdpbf16ps (with the avx512 kernel) instead of
// converting their tiles to f32: by default on AMD CPUs, where it is the faster, and off on Intel
// ones, where it runs at half the f32 FMA rate (ops/cpu_gemm.cpp, Note [bf16 dot by vendor]);
// MG_BF16_DOT=0|1 at start-up or this setter override it (an error without AVX512-BF16).
bool cpu_gemm_bf16_dot_supported();  // AVX512-BF16
bool cpu_gemm_bf16_dot();
void set_cpu_gemm_bf16_dot(bool on);

}  // namespace mg
