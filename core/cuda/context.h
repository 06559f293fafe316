// Per-device CUDA state: a device guard, one stream per device (every kernel, copy and library
// call of memgrad runs on it, so the caching allocator may reuse a freed block at once: stream
// order keeps the old and the new user apart), and the cuBLAS, cuBLASLt and cuDNN handles,
// created on first use and bound to that stream. Device properties are read once.
#pragma once
#include "core/cuda/cuda_check.h"

namespace mg::cuda {

// Makes `index` the current device for its scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

cudaStream_t stream(int device);
cublasHandle_t cublas_handle(int device);
cublasLtHandle_t cublaslt_handle(int device);
#ifdef MG_WITH_CUDNN
cudnnHandle_t cudnn_handle(int device);
#endif
const cudaDeviceProp& properties(int device);

// Blocks for a grid-stride kernel over n items: enough to fill the GPU a few times over, never
// more than the items need, at least 1.
unsigned grid_for(int device, int64_t n, int threads, int waves = 8);

}  // namespace mg::cuda
