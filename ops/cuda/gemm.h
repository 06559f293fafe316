// The one strided-batched GEMM entry of the CUDA ops (matmul.cu implements it): row-major
// C = alpha op(A) op(B) + beta C for `batch` matrices spaced by element strides, A (M, K) or,
// when ta, stored (K, M); B (K, N) or stored (N, K). cuBLAS with a workspace from the caching
// allocator; f32 accumulation for f16/bf16, TF32 for f32 only when allow_tf32(). Host code only.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace mg::cuda {

void gemm_strided_batched(int device, DType dtype, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                          const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b,
                          double beta, void* C, int64_t ldc, int64_t stride_c, int64_t batch);

}  // namespace mg::cuda
