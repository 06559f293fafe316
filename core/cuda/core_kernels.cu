// The CUDA side of core/tensor.cpp's memory primitives: fill_, copy_ (any strides, any dtype
// pair, converting through compute types exactly as the CPU's convert_scalar, since it is the
// same MG_HOST_DEVICE function) and accumulate_ (how autograd sums gradients). Grid-stride
// kernels; contiguous operands skip the indexer, and a same-dtype contiguous copy is a memcpy.
#include "core/cuda/backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mg::cuda {
namespace {

template <class T>
__global__ void fill_kernel(T* p, int64_t n, T v, Indexer<1> ix, bool contiguous) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (contiguous) {
      p[i] = v;
    } else {
      int64_t off[1];
      ix.offsets(i, off);
      p[off[0]] = v;
    }
  }
}

template <class D, class S>
__global__ void copy_kernel(D* d, const S* s, int64_t n, Indexer<2> ix, bool contiguous) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (contiguous) {
      d[i] = convert_scalar<D, S>(s[i]);
    } else {
      int64_t off[2];
      ix.offsets(i, off);
      d[off[0]] = convert_scalar<D, S>(s[off[1]]);
    }
  }
}

template <class T>
__global__ void accumulate_kernel(T* d, const T* s, int64_t n, Indexer<2> ix, bool contiguous) {
  using C = compute_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t od = i, os = i;
    if (!contiguous) {
      int64_t off[2];
      ix.offsets(i, off);
      od = off[0], os = off[1];
    }
    d[od] = T(C(d[od]) + C(s[os]));
  }
}

template <class T>
T* base_of(const Tensor& t) {
  return static_cast<T*>(t.storage()->data()) + t.storage_offset();
}

void check_cuda_tensor(const char* op, const Tensor& t) {
  MG_CHECK(t.device().is_cuda(), op, ": expected a cuda tensor, got one on ", t.device().str());
}

}  // namespace

void fill(const Tensor& t, double value) {
  check_cuda_tensor("fill_", t);
  const int64_t n = t.numel();
  if (n == 0) return;
  const int dev = t.device().index;
  DeviceGuard g(dev);
  Indexer<1> ix = make_indexer<1>(t.shape(), {t.strides().data()}, "fill_");
  const bool contiguous = t.is_contiguous();
  MG_DISPATCH_ALL(t.dtype(), "fill_", [&] {
    fill_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        base_of<scalar_t>(t), n, convert_scalar<scalar_t, double>(value), ix, contiguous);
    MG_CUDA_CHECK_LAUNCH("fill_kernel");
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  check_cuda_tensor("copy_", dst);
  MG_CHECK(dst.device() == src.device(), "copy_: ", src.device().str(), " -> ", dst.device().str(),
           " is not a copy within one GPU");
  MG_CHECK(dst.shape() == src.shape(), "copy_: shapes differ: ", shape_str(dst.shape()), " vs ", shape_str(src.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int dev = dst.device().index;
  DeviceGuard g(dev);
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  if (contiguous && dst.dtype() == src.dtype()) {
    MG_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream(dev)));
    return;
  }
  Indexer<2> ix = make_indexer<2>(dst.shape(), {dst.strides().data(), src.strides().data()}, "copy_");
  MG_DISPATCH_ALL(dst.dtype(), "copy_", [&] {
    using D = scalar_t;
    MG_DISPATCH_ALL(src.dtype(), "copy_", [&] {
      copy_kernel<D, scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
          base_of<D>(dst), base_of<const scalar_t>(src), n, ix, contiguous);
      MG_CUDA_CHECK_LAUNCH("copy_kernel");
    });
  });
}

void accumulate(const Tensor& dst, const Tensor& src) {
  check_cuda_tensor("accumulate_", dst);
  MG_CHECK(dst.device() == src.device() && dst.dtype() == src.dtype() && dst.shape() == src.shape(),
           "accumulate_: ", shape_str(src.shape()), " ", src.dtype(), " on ", src.device().str(), " into ",
           shape_str(dst.shape()), " ", dst.dtype(), " on ", dst.device().str());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int dev = dst.device().index;
  DeviceGuard g(dev);
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  Indexer<2> ix = make_indexer<2>(dst.shape(), {dst.strides().data(), src.strides().data()}, "accumulate_");
  MG_DISPATCH_NUMERIC(dst.dtype(), "accumulate_", [&] {
    accumulate_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        base_of<scalar_t>(dst), base_of<const scalar_t>(src), n, ix, contiguous);
    MG_CUDA_CHECK_LAUNCH("accumulate_kernel");
  });
}

}  // namespace mg::cuda
