// Status checks for the CUDA runtime, cuBLAS(Lt) and cuDNN. Every call into them goes through one
// of these macros, and every kernel launch is followed by MG_CUDA_CHECK_LAUNCH, so a failure is an
// mg::Error naming the op being run (OpNameGuard), the statement, file, line and the library's
// own error string: "CUDA error in softmax: cudaMemcpyAsync(...) at core/cuda/...:42: ...".
// Set MG_CUDA_LAUNCH_BLOCKING=1 to synchronise after each launch (errors at the failing kernel).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef MG_WITH_CUDNN
#include <cudnn.h>
#endif

namespace mg::cuda::detail {

[[noreturn]] void throw_cuda(const char* stmt, const char* file, int line, cudaError_t e);
[[noreturn]] void throw_cublas(const char* stmt, const char* file, int line, cublasStatus_t s);
#ifdef MG_WITH_CUDNN
[[noreturn]] void throw_cudnn(const char* stmt, const char* file, int line, cudnnStatus_t s);
#endif
// cudaGetLastError after a launch (and a stream sync under MG_CUDA_LAUNCH_BLOCKING=1).
void check_launch(const char* kernel, const char* file, int line);

}  // namespace mg::cuda::detail

#define MG_CUDA_CHECK(stmt)                                                           \
  do {                                                                                \
    cudaError_t mg_err_ = (stmt);                                                     \
    if (mg_err_ != cudaSuccess) [[unlikely]]                                          \
      ::mg::cuda::detail::throw_cuda(#stmt, __FILE__, __LINE__, mg_err_);             \
  } while (0)

#define MG_CUBLAS_CHECK(stmt)                                                         \
  do {                                                                                \
    cublasStatus_t mg_st_ = (stmt);                                                   \
    if (mg_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                 \
      ::mg::cuda::detail::throw_cublas(#stmt, __FILE__, __LINE__, mg_st_);            \
  } while (0)

#define MG_CUDNN_CHECK(stmt)                                                          \
  do {                                                                                \
    cudnnStatus_t mg_st_ = (stmt);                                                    \
    if (mg_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                  \
      ::mg::cuda::detail::throw_cudnn(#stmt, __FILE__, __LINE__, mg_st_);             \
  } while (0)

// After every <<<...>>>: MG_CUDA_CHECK_LAUNCH("softmax_rows_kernel").
#define MG_CUDA_CHECK_LAUNCH(kernel) ::mg::cuda::detail::check_launch(kernel, __FILE__, __LINE__)
