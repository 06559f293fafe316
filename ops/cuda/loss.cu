// CUDA cross_entropy, fused with log-softmax as on the CPU (loss.cpp): the targets are checked on
// the device (the first bad position is found with an atomic min, so the error names the same
// target as the CPU's), one block per row computes lse = log(sum(exp(x))) in one online pass and
// the row's loss, and one block adds the row losses in a fixed tree. Backward recomputes
// softmax = exp(x - lse) from the logits and reads dloss on the device (no host round trip).
#include <climits>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"
#include "ops/cuda/row_reduce.cuh"

namespace mg::cuda {
namespace {

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// stats[0] += targets not ignored; stats[1] = min position of a target outside [0, C).
template <class I>
__global__ void count_targets_kernel(unsigned long long* stats, const I* t, int64_t N, int64_t ts, int64_t C,
                                     int64_t ignore_index) {
  unsigned long long count = 0;
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, N) {
    const int64_t v = int64_t(t[i * ts]);
    if (v == ignore_index) continue;
    if (v < 0 || v >= C) atomicMin(&stats[1], (unsigned long long)i);
    else ++count;
  }
  if (count) atomicAdd(&stats[0], count);  // integer adds: the total is exact in any order
}

// Per row i: lse[i] (0 for an ignored row) and rowloss[i] = lse - x[i, t] in f64.
template <class T, class I>
__global__ void ce_forward_rows_kernel(stat_t<T>* lse, double* rowloss, const T* x, int64_t C, int64_t s0, int64_t s1,
                                       const I* t, int64_t ts, int64_t ignore_index) {
  using S = stat_t<T>;
  __shared__ MaxSum<S> shared[32];
  const int64_t i = blockIdx.x;
  const int64_t target = int64_t(t[i * ts]);
  if (target == ignore_index) {  // uniform over the block: every thread leaves
    if (threadIdx.x == 0) lse[i] = S(0), rowloss[i] = 0.0;
    return;
  }
  const T* row = x + i * s0;
  MaxSum<S> st{S(-INFINITY), S(0)};
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) st = max_sum_add(st, S(row[j * s1]));
  st = block_max_sum(st, shared);
  if (threadIdx.x == 0) {
    const S l = st.m + ::log(st.s);
    lse[i] = l;
    rowloss[i] = double(l) - double(S(row[target * s1]));
  }
}

template <class T>
__global__ void ce_mean_kernel(T* loss, const double* rowloss, int64_t N, int64_t count) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += rowloss[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *loss = T(compute_t<T>(count == 0 ? 0.0 : acc / double(count)));
}

template <class T, class I>
__global__ void ce_backward_rows_kernel(T* dx, const T* x, int64_t C, int64_t s0, int64_t s1, const I* t, int64_t ts,
                                        const stat_t<T>* lse, const T* dloss, int64_t ignore_index, int64_t count) {
  using S = stat_t<T>;
  const int64_t i = blockIdx.x;
  const int64_t target = int64_t(t[i * ts]);
  T* o = dx + i * C;
  if (target == ignore_index) {
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) o[j] = T(0.0f);
    return;
  }
  // As the CPU: scale = dloss / count in f64, then rounded to the stat type.
  const S k = S(count == 0 ? 0.0 : double(compute_t<T>(*dloss)) / double(count));
  const T* row = x + i * s0;
  const S l = lse[i];
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const S p = ::exp(S(row[j * s1]) - l);
    o[j] = T((j == target ? p - S(1) : p) * k);
  }
}

}  // namespace

int64_t cross_entropy_count(const Tensor& target, int64_t C, int64_t ignore_index) {
  const int64_t N = target.size(0);
  if (N == 0) return 0;
  const int dev = target.device().index;
  DeviceGuard g(dev);
  Tensor stats;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    stats = empty({2}, {.dtype = DType::i64, .device = target.device()});  // (count, first bad position)
  }
  auto* ps = static_cast<unsigned long long*>(stats.data_ptr());
  MG_CUDA_CHECK(cudaMemsetAsync(ps, 0, sizeof(unsigned long long), stream(dev)));
  MG_CUDA_CHECK(cudaMemsetAsync(ps + 1, 0xff, sizeof(unsigned long long), stream(dev)));  // ULLONG_MAX: none
  MG_DISPATCH_INDEX(target.dtype(), "cross_entropy", [&] {
    count_targets_kernel<scalar_t><<<grid_for(dev, N, kThreads, 2), kThreads, 0, stream(dev)>>>(
        ps, elem_ptr<const scalar_t>(target), N, target.stride(0), C, ignore_index);
    MG_CUDA_CHECK_LAUNCH("count_targets_kernel");
  });
  unsigned long long host[2];
  copy_bytes(host, kCPU, ps, target.device(), sizeof host);
  if (host[1] != ULLONG_MAX) {
    const int64_t pos = int64_t(host[1]);
    double v = target.as_strided({}, {}, target.storage_offset() + pos * target.stride(0)).item_double();
    MG_THROW("cross_entropy: target ", int64_t(v), " at position ", pos, " is out of range [0, ", C,
             ") (ignore_index is ", ignore_index, ")");
  }
  return int64_t(host[0]);
}

void cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           int64_t ignore_index, int64_t count) {
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0) return fill(loss, 0.0);
  MG_CHECK(N < (int64_t(1) << 31), "cross_entropy: ", N, " rows are too many for one CUDA launch");
  const int dev = logits.device().index;
  DeviceGuard g(dev);
  Tensor rowloss;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    rowloss = empty({N}, {.dtype = DType::f64, .device = logits.device()});  // (N)
  }
  MG_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    MG_DISPATCH_INDEX(target.dtype(), "cross_entropy", [&] {
      ce_forward_rows_kernel<T, scalar_t><<<unsigned(N), row_threads(C), 0, stream(dev)>>>(
          elem_ptr<stat_t<T>>(lse), rowloss.data<double>(), elem_ptr<const T>(logits), C, logits.stride(0),
          logits.stride(1), elem_ptr<const scalar_t>(target), target.stride(0), ignore_index);
      MG_CUDA_CHECK_LAUNCH("ce_forward_rows_kernel");
    });
    ce_mean_kernel<T><<<1, 512, 0, stream(dev)>>>(elem_ptr<T>(loss), rowloss.data<double>(), N, count);
    MG_CUDA_CHECK_LAUNCH("ce_mean_kernel");
  });
}

void cross_entropy_backward(const Tensor& dx, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            const Tensor& dloss, int64_t ignore_index, int64_t count) {
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0 || C == 0) return;
  MG_CHECK(dx.is_contiguous() && dloss.numel() == 1 && dloss.dtype() == logits.dtype() &&
               dloss.device() == logits.device(),
           "cross_entropy backward: internal: bad CUDA operands");
  const int dev = logits.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(logits.dtype(), "cross_entropy backward", [&] {
    using T = scalar_t;
    MG_DISPATCH_INDEX(target.dtype(), "cross_entropy backward", [&] {
      ce_backward_rows_kernel<T, scalar_t><<<unsigned(N), row_threads(C), 0, stream(dev)>>>(
          elem_ptr<T>(dx), elem_ptr<const T>(logits), C, logits.stride(0), logits.stride(1),
          elem_ptr<const scalar_t>(target), target.stride(0), elem_ptr<const stat_t<T>>(lse), elem_ptr<const T>(dloss),
          ignore_index, count);
      MG_CUDA_CHECK_LAUNCH("ce_backward_rows_kernel");
    });
  });
}

}  // namespace mg::cuda
