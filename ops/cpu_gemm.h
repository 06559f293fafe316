// The CPU GEMM every matrix product goes through (matmul, linear, conv2d's im2col, attention):
// C = alpha * op(A) * op(B) + beta * C on row-major matrices with leading dimensions, where
// op(X) is X or X^T. One entry point so the backend choice (OpenBLAS or Eigen) is made once.
#pragma once
#include <cstdint>

namespace mg {

enum class Transpose : bool { no = false, yes = true };

// A: (M, K) (or (K, M) when transposed), B: (K, N) (or (N, K)), C: (M, N).
void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
              int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// Which library serves cpu_gemm ("OpenBLAS 0.3.21 (openmp)" or "Eigen 3.4"), for `memgrad info`.
const char* cpu_gemm_backend();

}  // namespace mg
