// cpu_gemm on OpenBLAS's cblas (built on OpenMP, sharing memgrad's thread pool).
#include "ops/cpu_gemm.h"

#include <cblas.h>

namespace mg {

void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta == Transpose::yes ? CblasTrans : CblasNoTrans,
              tb == Transpose::yes ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A, int(lda), B,
              int(ldb), beta, C, int(ldc));
}

void cpu_gemm(Transpose ta, Transpose tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
              int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta == Transpose::yes ? CblasTrans : CblasNoTrans,
              tb == Transpose::yes ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A, int(lda), B,
              int(ldb), beta, C, int(ldc));
}

const char* cpu_gemm_backend() { return "OpenBLAS (cblas, OpenMP threads)"; }

}  // namespace mg
