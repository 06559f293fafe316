// Fake quantization for quantization-aware training on CUDA (ops/fake_quantize.h,
// ops/fake_quantize_learned.h). The forwards go element by element through the CPU's own element
// math (ops/kernels/fake_quantize.h), so values and STE masks equal the CPU's bit for bit. The LSQ
// backward is one pass that writes dx (bit for bit too) and an f64 partial of the scale gradient
// per chunk, then a pass that adds each channel's partials in chunk order: deterministic, no
// atomics; Note [LSQ sum order] says how it differs from the CPU's sum. Contiguous f32 operands.
#include "core/cuda/context.h"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/int8_launchers.h"

namespace mg::cuda {
namespace {

// Note [LSQ sum order]
// The scale gradient of channel c is grad_factor * sum of t_i = dout_i * g_i over its elements
// (g_i from fq::lsq_coefficient); every term is one f32 product of the same f32 values, so the
// terms are the CPU's bit for bit. The sum is laid out as on the CPU: the channel's elements in
// chunks of fq::kScaleGradChunk, one f64 partial per chunk, the partials of a channel added in
// chunk order by one thread, times grad_factor in f64, rounded to f32. The one difference is the
// order within a chunk: the CPU adds its terms one after another in element order; here thread t
// of kSumThreads adds elements t, t + kSumThreads, ... in order and the block adds the thread sums
// in block_sum's fixed tree (warp shuffles, then the warps' sums). The order is fixed by these
// constants alone (not by the GPU's number of SMs), so a run gives the same bits every time. Both
// orders sum the same f64 terms, each within (kScaleGradChunk - 1) * 2^-53 * sum|t_i| (< 2e-12
// sum|t_i|) of the exact sum, so the f64 results differ by less than 4e-12 * grad_factor * sum|t_i|,
// and after rounding to f32 by at most one more ulp (where the two straddle a rounding boundary).
// tests/ops/test_cuda_fake_quantize.cpp allows 2 ulps plus 1e-11 * grad_factor * sum|t_i|.
constexpr int kSumThreads = 256;

__global__ void fake_quantize_channel_kernel(float* out, bool* mask, const float* x, const float* scales, int64_t n,
                                             int64_t inner) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    bool inside;
    out[i] = fq::symmetric_s8(x[i], scales[i / inner], inside);
    if (mask) mask[i] = inside;
  }
}

__global__ void fake_quantize_tensor_kernel(float* out, bool* mask, const float* x, int64_t n, float scale,
                                            float inv_scale, int32_t zero) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    bool inside;
    out[i] = fq::affine_u8(x[i], scale, inv_scale, zero, inside);
    if (mask) mask[i] = inside;
  }
}

// One block per chunk w of (C, chunks), blockDim.x == kSumThreads: dx of its elements (dx may be
// null) and, when partial is not null, partial[w] = its sum of dout * g in f64.
__global__ void lsq_backward_kernel(float* dx, double* partial, const float* x, const float* dout,
                                    const float* scales, int64_t inner, int64_t chunks, fq::Grid q,
                                    fq::ScaleDivision division) {
  __shared__ double shared[32];
  const int64_t w = blockIdx.x, c = w / chunks;
  const int64_t begin = c * inner + (w % chunks) * fq::kScaleGradChunk;
  const int64_t end = min(begin + fq::kScaleGradChunk, (c + 1) * inner);
  const float s = scales[c], inv = fq::div_rn(1.f, s);  // the CPU's 1.f / s
  double sum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    bool inside;
    const float coef = fq::lsq_coefficient(x[i], s, inv, q, division, inside);
    if (dx) dx[i] = inside ? dout[i] : 0.f;
    sum += double(fq::mul_rn(dout[i], coef));
  }
  if (!partial) return;  // the same for the whole block: no thread waits in block_sum alone
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partial[w] = sum;
}

// dscale[c] = f32(grad_factor * the partials of channel c added in chunk order), one thread each.
__global__ void lsq_scale_sum_kernel(float* dscale, const double* partial, int64_t C, int64_t chunks,
                                     double grad_factor) {
  MG_GRID_STRIDE(c, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, C) {
    double sum = 0.0;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[c * chunks + k];
    dscale[c] = float(sum * grad_factor);
  }
}

}  // namespace

void fake_quantize_per_channel(const Tensor& out, const Tensor& mask, const Tensor& x, const Tensor& scales) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  DeviceGuard g(dev);
  fake_quantize_channel_kernel<<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
      elem_ptr<float>(out), mask.defined() ? elem_ptr<bool>(mask) : nullptr, elem_ptr<const float>(x),
      elem_ptr<const float>(scales), n, n / scales.numel());
  MG_CUDA_CHECK_LAUNCH("fake_quantize_channel_kernel");
}

void fake_quantize_per_tensor(const Tensor& out, const Tensor& mask, const Tensor& x, float scale, float inv_scale,
                              int32_t zero) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  DeviceGuard g(dev);
  fake_quantize_tensor_kernel<<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
      elem_ptr<float>(out), mask.defined() ? elem_ptr<bool>(mask) : nullptr, elem_ptr<const float>(x), n, scale,
      inv_scale, zero);
  MG_CUDA_CHECK_LAUNCH("fake_quantize_tensor_kernel");
}

void fake_quantize_learned_backward(const Tensor& dx, const Tensor& dscale, const Tensor& x, const Tensor& dout,
                                    const Tensor& scales, fq::Grid q, fq::ScaleDivision division, double grad_factor) {
  const int64_t n = x.numel(), C = scales.numel();
  if (n == 0 || (!dx.defined() && !dscale.defined())) return;
  const int64_t inner = n / C, chunks = (inner + fq::kScaleGradChunk - 1) / fq::kScaleGradChunk;
  MG_CHECK(C * chunks < (int64_t(1) << 31), "fake_quantize_learned backward: ", n,
           " elements are too many for one CUDA launch");
  const int dev = x.device().index;
  DeviceGuard g(dev);
  Tensor partial;  // (C, chunks) f64
  if (dscale.defined()) {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    partial = empty({C, chunks}, {.dtype = DType::f64, .device = x.device()});
  }
  lsq_backward_kernel<<<unsigned(C * chunks), kSumThreads, 0, stream(dev)>>>(
      dx.defined() ? elem_ptr<float>(dx) : nullptr, partial.defined() ? elem_ptr<double>(partial) : nullptr,
      elem_ptr<const float>(x), elem_ptr<const float>(dout), elem_ptr<const float>(scales), inner, chunks, q,
      division);
  MG_CUDA_CHECK_LAUNCH("lsq_backward_kernel");
  if (!dscale.defined()) return;
  lsq_scale_sum_kernel<<<grid_for(dev, C, kThreads), kThreads, 0, stream(dev)>>>(
      elem_ptr<float>(dscale), elem_ptr<const double>(partial), C, chunks, grad_factor);
  MG_CUDA_CHECK_LAUNCH("lsq_scale_sum_kernel");
}

}  // namespace mg::cuda
