// CUDA comparisons (bool results, tensor-tensor broadcasting and tensor-scalar in f64 as the
// CPU compares) and where(cond, a, b) with all three broadcast.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class F>
void run_compare(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  MG_DISPATCH_NUMERIC(a.dtype(), op, [&] { launch_map2<bool, scalar_t>(op, out, a, b, f); });
}

// f(double(x), s): the CPU's compare_scalar converts both sides to f64.
template <class F>
struct CompareWithScalar {
  F f;
  double s;
  template <class T>
  __device__ __forceinline__ bool operator()(T x) const { return f(double(x), s); }
};

template <class F>
void run_compare_scalar(const char* op, const Tensor& out, const Tensor& a, double s, F f) {
  MG_DISPATCH_NUMERIC(a.dtype(), op, [&] { launch_map1<bool, scalar_t>(op, out, a, CompareWithScalar<F>{f, s}); });
}

template <class T>
__global__ void where_kernel(T* o, const bool* c, const T* a, const T* b, int64_t n, Indexer<3> ix) {
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    int64_t off[3];
    ix.offsets(i, off);
    o[i] = c[off[0]] ? a[off[1]] : b[off[2]];
  }
}

}  // namespace

void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (op) {
    case CompareOp::eq: return run_compare("eq", out, a, b, fn::Eq{});
    case CompareOp::ne: return run_compare("ne", out, a, b, fn::Ne{});
    case CompareOp::lt: return run_compare("lt", out, a, b, fn::Lt{});
    case CompareOp::le: return run_compare("le", out, a, b, fn::Le{});
    case CompareOp::gt: return run_compare("gt", out, a, b, fn::Gt{});
    case CompareOp::ge: return run_compare("ge", out, a, b, fn::Ge{});
  }
  MG_THROW("cuda::compare: unknown op code ", int(op));
}

void compare_scalar(CompareOp op, const Tensor& out, const Tensor& a, double s) {
  switch (op) {
    case CompareOp::eq: return run_compare_scalar("eq", out, a, s, fn::Eq{});
    case CompareOp::ne: return run_compare_scalar("ne", out, a, s, fn::Ne{});
    case CompareOp::lt: return run_compare_scalar("lt", out, a, s, fn::Lt{});
    case CompareOp::le: return run_compare_scalar("le", out, a, s, fn::Le{});
    case CompareOp::gt: return run_compare_scalar("gt", out, a, s, fn::Gt{});
    case CompareOp::ge: return run_compare_scalar("ge", out, a, s, fn::Ge{});
  }
  MG_THROW("cuda::compare_scalar: unknown op code ", int(op));
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MG_CHECK(out.is_contiguous() && cond.dtype() == DType::b8, "where: internal: bad CUDA operands");
  const int dev = out.device().index;
  DeviceGuard g(dev);
  const Shape& s = out.shape();
  Shape sc = bcast_strides(cond, s), sa = bcast_strides(a, s), sb = bcast_strides(b, s);
  Indexer<3> ix = make_indexer<3>(s, {sc.data(), sa.data(), sb.data()}, "where");
  MG_DISPATCH_ALL(out.dtype(), "where", [&] {
    where_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        elem_ptr<scalar_t>(out), elem_ptr<const bool>(cond), elem_ptr<const scalar_t>(a), elem_ptr<const scalar_t>(b),
        n, ix);
    MG_CUDA_CHECK_LAUNCH("where_kernel");
  });
}

}  // namespace mg::cuda
