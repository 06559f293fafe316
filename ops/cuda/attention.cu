// CUDA scaled-dot-product attention, the same "math" path as ops/attention.cpp: the (S, T, T)
// scores come from one strided-batched GEMM over all B * NH slices, a row kernel applies the
// causal mask, the softmax (exp(x - max) / sum, as the CPU) and the dropout factor drawn from
// Philox at the CPU's stream positions, and a second batched GEMM gives out. Backward runs the
// same GEMMs transposed and one row kernel for dS. Compute dtype f32 (f64 for f64).
#include "core/rng.h"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/gemm.h"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

// The factor of weight (row, j): 0 or 1 / (1 - p), from uniform(seed, offset + row * T + j).
template <class C>
__device__ __forceinline__ C drop_factor(const AttentionDims& d, int64_t row, int64_t j) {
  const uint64_t pos = d.offset + uint64_t(row * d.T + j);
  const float u = uint_to_unit_float(philox4x32(d.seed, 0, pos >> 2)[pos & 3]);
  return u >= float(d.p) ? C(1.0 / (1.0 - d.p)) : C(0);
}

// One block per score row r (query position i = r % T): softmax over its first L entries.
template <class C>
__global__ void attention_softmax_kernel(C* p, C* pd, AttentionDims d) {
  __shared__ C shared[32];
  const int64_t r = blockIdx.x, T = d.T, i = r % T;
  const int64_t L = d.causal ? i + 1 : T;
  C* row = p + r * T;
  C mx = C(-INFINITY);
  for (int64_t j = threadIdx.x; j < L; j += blockDim.x) mx = row[j] > mx || row[j] != row[j] ? row[j] : mx;
  mx = block_max(mx, shared, C(-INFINITY));
  C sum = 0;
  for (int64_t j = threadIdx.x; j < L; j += blockDim.x) sum += ::exp(row[j] - mx);
  sum = block_sum(sum, shared);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    const C w = j < L ? ::exp(row[j] - mx) / sum : C(0);
    row[j] = w;
    if (pd) pd[r * T + j] = w * drop_factor<C>(d, r, j);
  }
}

template <class C>
__global__ void attention_drop_kernel(C* out, const C* p, AttentionDims d) {
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, d.S * d.T * d.T) {
    out[e] = p[e] * drop_factor<C>(d, e / d.T, e % d.T);
  }
}

// buf row r holds dP; becomes dS = p * (dP' - sum_j p dP') * scale, dP' = dP * dropout factor.
template <class C>
__global__ void attention_dscores_kernel(C* buf, const C* p, AttentionDims d) {
  __shared__ C shared[32];
  const int64_t r = blockIdx.x, T = d.T, i = r % T;
  const int64_t L = d.causal ? i + 1 : T;
  C* row = buf + r * T;
  const C* pr = p + r * T;
  C dot = 0;
  for (int64_t j = threadIdx.x; j < L; j += blockDim.x) {
    C g = row[j];
    if (d.p > 0) g *= drop_factor<C>(d, r, j);
    row[j] = g;
    dot += pr[j] * g;
  }
  dot = block_sum(dot, shared);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) row[j] = j < L ? pr[j] * (row[j] - dot) * C(d.scale) : C(0);
}

int row_block(int64_t T) { return T >= 1024 ? 256 : T >= 256 ? 128 : T > 32 ? 64 : 32; }

void check_operand(const Tensor& t, DType c, const char* what) {
  MG_CHECK(!t.defined() || (t.is_contiguous() && t.dtype() == c), "scaled_dot_product_attention: internal: ", what,
           " must be contiguous ", c, " on CUDA");
}

}  // namespace

void attention_forward(const AttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p,
                       const Tensor& pd, const Tensor& out) {
  if (d.S == 0 || d.T == 0) return;
  const DType c = q.dtype();
  for (const Tensor* t : {&q, &k, &v, &p, &pd, &out}) check_operand(*t, c, "operand");
  MG_CHECK(d.S * d.T < (int64_t(1) << 31), "scaled_dot_product_attention: too many score rows for one CUDA launch");
  const int dev = q.device().index;
  DeviceGuard g(dev);
  const int64_t T = d.T, HS = d.HS, TT = T * T, THS = T * HS;
  // p = scale * q k^T, per slice (T, HS) x (T, HS)^T
  gemm_strided_batched(dev, c, false, true, T, T, HS, d.scale, q.data_ptr(), HS, THS, k.data_ptr(), HS, THS, 0.0,
                       p.data_ptr(), T, TT, d.S);
  MG_DISPATCH_FLOAT(c, "scaled_dot_product_attention", [&] {
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
      attention_softmax_kernel<scalar_t><<<unsigned(d.S * T), row_block(T), 0, stream(dev)>>>(
          static_cast<scalar_t*>(p.data_ptr()), pd.defined() ? static_cast<scalar_t*>(pd.data_ptr()) : nullptr, d);
      MG_CUDA_CHECK_LAUNCH("attention_softmax_kernel");
    } else {
      MG_THROW("scaled_dot_product_attention: internal: compute dtype ", c);
    }
  });
  // out = w v, per slice (T, T) x (T, HS)
  const Tensor& w = pd.defined() ? pd : p;
  gemm_strided_batched(dev, c, false, false, T, HS, T, 1.0, w.data_ptr(), T, TT, v.data_ptr(), HS, THS, 0.0,
                       out.data_ptr(), HS, THS, d.S);
}

void attention_backward(const AttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p,
                        const Tensor& dout, const Tensor& buf, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  if (d.S == 0 || d.T == 0) return;
  const DType c = p.dtype();
  for (const Tensor* t : {&q, &k, &v, &p, &dout, &buf, &dq, &dk, &dv}) check_operand(*t, c, "operand");
  const int dev = p.device().index;
  DeviceGuard g(dev);
  const int64_t T = d.T, HS = d.HS, TT = T * T, THS = T * HS;
  MG_DISPATCH_FLOAT(c, "scaled_dot_product_attention backward", [&] {
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
      using C = scalar_t;
      if (dv.defined()) {
        const void* w = p.data_ptr();
        if (d.p > 0) {  // the weights the forward multiplied v with
          attention_drop_kernel<C><<<grid_for(dev, d.S * TT, kThreads), kThreads, 0, stream(dev)>>>(
              static_cast<C*>(buf.data_ptr()), static_cast<const C*>(p.data_ptr()), d);
          MG_CUDA_CHECK_LAUNCH("attention_drop_kernel");
          w = buf.data_ptr();
        }
        // dv = w^T dout: (T, T)^T x (T, HS)
        gemm_strided_batched(dev, c, true, false, T, HS, T, 1.0, w, T, TT, dout.data_ptr(), HS, THS, 0.0,
                             dv.data_ptr(), HS, THS, d.S);
      }
      if (!dq.defined() && !dk.defined()) return;
      // buf = dP = dout v^T: (T, HS) x (T, HS)^T
      gemm_strided_batched(dev, c, false, true, T, T, HS, 1.0, dout.data_ptr(), HS, THS, v.data_ptr(), HS, THS, 0.0,
                           buf.data_ptr(), T, TT, d.S);
      attention_dscores_kernel<C><<<unsigned(d.S * T), row_block(T), 0, stream(dev)>>>(
          static_cast<C*>(buf.data_ptr()), static_cast<const C*>(p.data_ptr()), d);
      MG_CUDA_CHECK_LAUNCH("attention_dscores_kernel");
      if (dq.defined())  // dq = dS k: (T, T) x (T, HS)
        gemm_strided_batched(dev, c, false, false, T, HS, T, 1.0, buf.data_ptr(), T, TT, k.data_ptr(), HS, THS, 0.0,
                             dq.data_ptr(), HS, THS, d.S);
      if (dk.defined())  // dk = dS^T q
        gemm_strided_batched(dev, c, true, false, T, HS, T, 1.0, buf.data_ptr(), T, TT, q.data_ptr(), HS, THS, 0.0,
                             dk.data_ptr(), HS, THS, d.S);
    } else {
      MG_THROW("scaled_dot_product_attention backward: internal: compute dtype ", c);
    }
  });
}

}  // namespace mg::cuda
