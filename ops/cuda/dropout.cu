// CUDA dropout with the CPU's mask: element e of a call that reserved stream positions from
// `offset` is kept iff uniform(seed, offset + e) >= p, the uniform taken from word (pos & 3) of
// philox4x32(seed, 0, pos >> 2) (core/rng.h, the same MG_HOST_DEVICE function). Each thread draws
// one Philox block and serves the (up to) four elements it covers.
#include "core/rng.h"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class T>
__global__ void dropout_kernel(T* out, const T* x, int64_t n, uint64_t seed, uint64_t offset, float threshold,
                               compute_t<T> scale) {
  using C = compute_t<T>;
  const uint64_t first_block = offset >> 2;
  const int64_t blocks = int64_t(((offset + uint64_t(n) + 3) >> 2) - first_block);
  MG_GRID_STRIDE(b, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, blocks) {
    const uint64_t block = first_block + uint64_t(b);
    const auto words = philox4x32(seed, 0, block);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t e = int64_t(block * 4 + uint64_t(w) - offset);  // wraps below 0 for positions before offset
      if (block * 4 + uint64_t(w) < offset || e >= n) continue;
      out[e] = uint_to_unit_float(words[w]) >= threshold ? T(C(x[e]) * scale) : T(0.0f);
    }
  }
}

}  // namespace

void dropout(const Tensor& out, const Tensor& x, uint64_t seed, uint64_t offset, double p) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MG_CHECK(out.is_contiguous() && x.is_contiguous(), "dropout: internal: CUDA operands must be contiguous");
  const int dev = out.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(x.dtype(), "dropout", [&] {
    using C = compute_t<scalar_t>;
    const int64_t blocks = (n + 3) / 4 + 1;
    dropout_kernel<scalar_t><<<grid_for(dev, blocks, kThreads), kThreads, 0, stream(dev)>>>(
        elem_ptr<scalar_t>(out), elem_ptr<const scalar_t>(x), n, seed, offset, float(p), C(1.0 / (1.0 - p)));
    MG_CUDA_CHECK_LAUNCH("dropout_kernel");
  });
}

}  // namespace mg::cuda
