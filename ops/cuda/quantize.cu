// The quantize / dequantize ops of ops/quantize.h on CUDA, element by element with the CPU's
// arithmetic: quantize_u8 (ops/int8_requant.h, the same MG_HOST_DEVICE function), and single f32
// products for dequantization, so every value equals the CPU's bit for bit. Contiguous operands.
#include "core/cuda/context.h"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/int8_launchers.h"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

__global__ void quantize_kernel(uint8_t* q, const float* x, int64_t n, float inv_scale, int32_t zero) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) q[i] = quantize_u8(x[i], inv_scale, zero);
}

__global__ void dequantize_tensor_kernel(float* out, const uint8_t* q, int64_t n, float scale, int32_t zero) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n)
  out[i] = __fmul_rn(scale, float(int32_t(q[i]) - zero));
}

__global__ void dequantize_channel_kernel(float* out, const int8_t* q, const float* scales, int64_t n,
                                          int64_t inner) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n)
  out[i] = __fmul_rn(float(q[i]), scales[i / inner]);
}

}  // namespace

void quantize_per_tensor(const Tensor& out, const Tensor& x, float inv_scale, int32_t zero) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  DeviceGuard g(dev);
  quantize_kernel<<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
      elem_ptr<uint8_t>(out), elem_ptr<const float>(x), n, inv_scale, zero);
  MG_CUDA_CHECK_LAUNCH("quantize_kernel");
}

void dequantize_per_tensor(const Tensor& out, const Tensor& q, float scale, int32_t zero) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  DeviceGuard g(dev);
  dequantize_tensor_kernel<<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
      elem_ptr<float>(out), elem_ptr<const uint8_t>(q), n, scale, zero);
  MG_CUDA_CHECK_LAUNCH("dequantize_tensor_kernel");
}

void dequantize_per_channel(const Tensor& out, const Tensor& values, const Tensor& scales) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  DeviceGuard g(dev);
  dequantize_channel_kernel<<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
      elem_ptr<float>(out), elem_ptr<const int8_t>(values), elem_ptr<const float>(scales), n, n / values.size(0));
  MG_CUDA_CHECK_LAUNCH("dequantize_channel_kernel");
}

}  // namespace mg::cuda
