// The int8 depthwise convolution of ops/int8_depthwise.h on CUDA: one thread per output
// (n, c, oh, ow) of the NCHW result sums w[c][kh][kw] * (x - zx) over the taps inside the image in
// int32 (a padding tap reads zx, so it contributes 0 and is skipped), then writes the raw sum or
// the CPU's requantization (Requant of ops/int8_requant.h, MG_HOST_DEVICE) with channel c's scale
// and bias. Integer sums are exact, so the result equals int8_depthwise_ref and the CPU paths bit
// for bit. Any kernel size, stride and padding.
#include "core/cuda/context.h"
#include "ops/cuda/int8_launchers.h"

namespace mg::cuda {
namespace {

constexpr int kBlock = 256;

struct DepthwiseArgs {
  int64_t N, C, H, W, K, stride, padding, OH, OW;
  const uint8_t* x;
  int32_t zx;
  const int8_t* w;
  Int8DepthwiseOut out;
};

__global__ void int8_depthwise_kernel(const DepthwiseArgs p) {
  const int64_t total = p.N * p.C * p.OH * p.OW;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = o % p.OW, oh = o / p.OW % p.OH, nc = o / (p.OW * p.OH), c = nc % p.C;
    const uint8_t* plane = p.x + nc * p.H * p.W;
    const int8_t* wc = p.w + c * p.K * p.K;
    int32_t acc = 0;
    for (int64_t kh = 0; kh < p.K; ++kh) {
      const int64_t ih = oh * p.stride - p.padding + kh;
      if (ih < 0 || ih >= p.H) continue;
      for (int64_t kw = 0; kw < p.K; ++kw) {
        const int64_t iw = ow * p.stride - p.padding + kw;
        if (iw >= 0 && iw < p.W) acc += int32_t(wc[kh * p.K + kw]) * (int32_t(plane[ih * p.W + iw]) - p.zx);
      }
    }
    const Int8DepthwiseOut& out = p.out;
    if (out.i32) {
      out.i32[o] = acc;
      continue;
    }
    Requant q = out.q;
    q.scale = out.scale[c];
    q.bias = out.bias ? out.bias[c] : 0.f;
    if (out.f32) out.f32[o] = q.f32(acc);
    else out.u8[o] = q.u8(acc);
  }
}

}  // namespace

void int8_depthwise(int device, const Int8DepthwiseShape& s, const uint8_t* x, int32_t zx, const int8_t* w,
                    const Int8DepthwiseOut& out) {
  const DepthwiseArgs p{.N = s.N, .C = s.C, .H = s.H, .W = s.W, .K = s.K, .stride = s.stride,
                        .padding = s.padding, .OH = s.OH(), .OW = s.OW(), .x = x, .zx = zx, .w = w, .out = out};
  const int64_t total = p.N * p.C * p.OH * p.OW;
  if (total == 0) return;
  DeviceGuard g(device);
  int8_depthwise_kernel<<<grid_for(device, total, kBlock), kBlock, 0, stream(device)>>>(p);
  MG_CUDA_CHECK_LAUNCH("int8_depthwise_kernel");
}

}  // namespace mg::cuda
