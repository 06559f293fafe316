// CUDA embedding: the gather, and a deterministic backward without atomics on floats. The
// positions are sorted by vocabulary row with CUB's radix sort, which is stable, so each row's
// positions stay in increasing order (the CPU's counting sort gives the same order); then one
// thread per (row, column) adds its row's gradients in that order. Each row is found in the
// sorted keys by binary search. Index checking finds the first bad position with an atomic min.
#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class I>
__global__ void check_indices_kernel(unsigned long long* first_bad, const I* idx, int64_t n, int64_t V) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    const int64_t v = int64_t(idx[i]);
    if (v < 0 || v >= V) atomicMin(first_bad, (unsigned long long)i);
  }
}

template <class T, class I>
__global__ void gather_kernel(T* out, const T* w, int64_t s0, int64_t s1, const I* idx, int64_t n, int64_t C) {
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n * C) {
    const int64_t i = e / C, c = e - i * C;
    out[e] = w[int64_t(idx[i]) * s0 + c * s1];
  }
}

template <class I>
__global__ void make_keys_kernel(int32_t* keys, int32_t* positions, const I* idx, int64_t n) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    keys[i] = int32_t(idx[i]);
    positions[i] = int32_t(i);
  }
}

// First k with keys[k] >= v in the sorted keys (n of them).
__device__ __forceinline__ int64_t lower_bound(const int32_t* keys, int64_t n, int32_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (keys[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// dweight[v, j] = sum over the positions of row v (increasing) of g[pos, j]; rows nobody picked: 0.
template <class T>
__global__ void scatter_rows_kernel(T* dw, const T* g, const int32_t* keys, const int32_t* positions, int64_t n,
                                    int64_t C) {
  using A = acc_t<T>;
  __shared__ int64_t range[2];
  const int32_t v = int32_t(blockIdx.x);
  if (threadIdx.x == 0) range[0] = lower_bound(keys, n, v), range[1] = lower_bound(keys, n, v + 1);
  __syncthreads();
  const int64_t j = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (j >= C) return;
  A acc = A(0);
  for (int64_t k = range[0]; k < range[1]; ++k) acc += A(compute_t<T>(g[int64_t(positions[k]) * C + j]));
  dw[int64_t(v) * C + j] = T(compute_t<T>(acc));
}

int bits_for(int64_t V) {
  int b = 1;
  while (b < 31 && (int64_t(1) << b) < V) ++b;
  return b;
}

}  // namespace

void check_indices(const Tensor& idx, int64_t V, const Tensor& weight) {
  const int64_t n = idx.numel();
  if (n == 0) return;
  MG_CHECK(idx.is_contiguous(), "embedding: internal: CUDA indices must be contiguous");
  const int dev = idx.device().index;
  DeviceGuard g(dev);
  Tensor flag;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    flag = empty({1}, {.dtype = DType::i64, .device = idx.device()});  // first bad position
  }
  auto* pf = static_cast<unsigned long long*>(flag.data_ptr());
  MG_CUDA_CHECK(cudaMemsetAsync(pf, 0xff, sizeof(unsigned long long), stream(dev)));  // ULLONG_MAX: none
  MG_DISPATCH_INDEX(idx.dtype(), "embedding", [&] {
    check_indices_kernel<scalar_t><<<grid_for(dev, n, kThreads, 2), kThreads, 0, stream(dev)>>>(
        pf, elem_ptr<const scalar_t>(idx), n, V);
    MG_CUDA_CHECK_LAUNCH("check_indices_kernel");
  });
  unsigned long long first = 0;
  copy_bytes(&first, kCPU, pf, idx.device(), sizeof first);
  if (first != ULLONG_MAX) {
    const int64_t pos = int64_t(first);
    const double v = idx.as_strided({}, {}, idx.storage_offset() + pos).item_double();
    MG_THROW("embedding: index ", int64_t(v), " at position ", pos, " is out of range for a vocabulary of ", V,
             " rows (weight ", shape_str(weight.shape()), ")");
  }
}

void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& idx) {
  const int64_t n = idx.numel(), C = weight.size(1);
  if (n == 0 || C == 0) return;
  MG_CHECK(out.is_contiguous() && idx.is_contiguous(), "embedding: internal: bad CUDA operands");
  const int dev = out.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_INDEX(idx.dtype(), "embedding", [&] {
    using I = scalar_t;
    MG_DISPATCH_FLOAT(weight.dtype(), "embedding", [&] {
      gather_kernel<scalar_t, I><<<grid_for(dev, n * C, kThreads), kThreads, 0, stream(dev)>>>(
          elem_ptr<scalar_t>(out), elem_ptr<const scalar_t>(weight), weight.stride(0), weight.stride(1),
          elem_ptr<const I>(idx), n, C);
      MG_CUDA_CHECK_LAUNCH("gather_kernel");
    });
  });
}

void embedding_backward(const Tensor& dweight, const Tensor& g, const Tensor& idx) {
  const int64_t V = dweight.size(0), C = dweight.size(1), n = idx.numel();
  if (V == 0 || C == 0) return;
  if (n == 0) return fill(dweight, 0.0);
  MG_CHECK(dweight.is_contiguous() && g.is_contiguous() && idx.is_contiguous(),
           "embedding backward: internal: bad CUDA operands");
  MG_CHECK(n < (int64_t(1) << 31) && V < (int64_t(1) << 31) && C < (int64_t(65535) * 128),
           "embedding backward: ", n, " indices into (", V, ", ", C, ") are too many for the CUDA kernel");
  const int dev = dweight.device().index;
  DeviceGuard guard(dev);
  cudaStream_t st = stream(dev);
  Tensor buffers;  // (4, n) i32: keys in, keys sorted, positions in, positions sorted
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    buffers = empty({4, n}, {.dtype = DType::i32, .device = dweight.device()});
  }
  int32_t* keys_in = buffers.data<int32_t>();
  int32_t *keys = keys_in + n, *pos_in = keys_in + 2 * n, *pos = keys_in + 3 * n;
  MG_DISPATCH_INDEX(idx.dtype(), "embedding backward", [&] {
    make_keys_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, st>>>(keys_in, pos_in,
                                                                                 elem_ptr<const scalar_t>(idx), n);
    MG_CUDA_CHECK_LAUNCH("make_keys_kernel");
  });
  size_t temp_bytes = 0;
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys, pos_in, pos, int(n), 0, bits_for(V),
                                                st));
  Tensor temp;  // CUB's scratch, through the allocator
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    temp = empty({int64_t(std::max<size_t>(temp_bytes, 1))}, {.dtype = DType::u8, .device = dweight.device()});
  }
  MG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in, keys, pos_in, pos, int(n), 0,
                                                bits_for(V), st));
  const int threads = 128;
  dim3 grid(unsigned(V), unsigned((C + threads - 1) / threads));
  MG_DISPATCH_FLOAT(dweight.dtype(), "embedding backward", [&] {
    scatter_rows_kernel<scalar_t><<<grid, threads, 0, st>>>(elem_ptr<scalar_t>(dweight), elem_ptr<const scalar_t>(g),
                                                            keys, pos, n, C);
    MG_CUDA_CHECK_LAUNCH("scatter_rows_kernel");
  });
}

}  // namespace mg::cuda
