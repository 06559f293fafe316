// Fused optimizer updates on the GPU: one kernel per parameter reads the gradient and the state
// once and writes the weights and the state once, with the CPU's order of operations (optim/
// adam.cpp, sgd.cpp) so results agree to rounding. A 16-bit parameter is updated through its f32
// master (Note [Master weights] in optim/optimizer.h) and receives the rounded result.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class P>
__global__ void adam_kernel(compute_t<P>* w, const P* g, compute_t<P>* m, compute_t<P>* v, P* param16, int64_t n,
                            AdamStep s) {
  using C = compute_t<P>;
  const C c_decay = C(1 - s.lr * s.weight_decay), c_wd = C(s.weight_decay), c_1mb1 = C(1 - s.beta1),
          c_b2 = C(s.beta2), c_1mb2 = C(1 - s.beta2), c_bc2 = C(s.bias_correction2_sqrt), c_eps = C(s.eps),
          c_step = C(s.lr / s.bias_correction1);
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    C d = C(g[i]), wi = w[i];
    if (s.weight_decay != 0) {
      if (s.decoupled) wi = wi * c_decay;
      else d = d + c_wd * wi;
    }
    const C mi = m[i] + c_1mb1 * (d - m[i]);  // lerp(m, g, 1 - beta1), as PyTorch
    const C vi = v[i] * c_b2 + c_1mb2 * d * d;
    const C denom = ::sqrt(vi) / c_bc2 + c_eps;
    wi = wi - c_step * (mi / denom);
    m[i] = mi, v[i] = vi, w[i] = wi;
    if (param16) param16[i] = P(wi);
  }
}

template <class P>
__global__ void sgd_kernel(compute_t<P>* w, const P* g, compute_t<P>* buf, P* param16, int64_t n, SgdStep s) {
  using C = compute_t<P>;
  const C c_wd = C(s.weight_decay), c_mom = C(s.momentum), c_damp = C(1 - s.dampening), c_lr = C(s.lr);
  MG_GRID_STRIDE(i, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) {
    C d = C(g[i]), wi = w[i];
    if (s.weight_decay != 0) d = d + c_wd * wi;
    if (s.momentum != 0) {
      const C b = s.first ? d : c_mom * buf[i] + c_damp * d;  // the buffer starts as the first gradient
      buf[i] = b;
      d = s.nesterov ? d + c_mom * b : b;
    }
    wi = wi - c_lr * d;
    w[i] = wi;
    if (param16) param16[i] = P(wi);
  }
}

// w, states: compute dtype of grad; param: undefined, or the 16-bit parameter behind the master w.
void check_step(const char* op, const Tensor& w, const Tensor& grad, std::initializer_list<const Tensor*> states,
                const Tensor& param) {
  const DType c = grad.dtype() == DType::f64 ? DType::f64 : DType::f32;
  auto ok = [&](const Tensor& t, DType dt) {
    return t.device() == grad.device() && t.is_contiguous() && t.numel() == grad.numel() && t.dtype() == dt;
  };
  MG_CHECK(grad.device().is_cuda() && grad.is_contiguous() && ok(w, c), op, ": weights ", w.dtype(), " on ",
           w.device().str(), " and gradient ", grad.dtype(), " on ", grad.device().str(),
           " must be contiguous, one CUDA device, weights in the gradient's compute dtype");
  for (const Tensor* s : states)
    if (s->defined()) MG_CHECK(ok(*s, c), op, ": a state tensor does not match the weights (", s->dtype(), " ",
                               shape_str(s->shape()), " on ", s->device().str(), ")");
  MG_CHECK(!param.defined() || ok(param, grad.dtype()), op, ": the 16-bit parameter does not match its gradient");
  MG_CHECK(param.defined() == (grad.dtype() == DType::f16 || grad.dtype() == DType::bf16), op,
           ": a 16-bit parameter is updated through its f32 master (and only then is `param` given)");
}

}  // namespace

void adam_step(const Tensor& w, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& param, const AdamStep& s) {
  check_step("adam_step", w, grad, {&exp_avg, &exp_avg_sq}, param);
  MG_CHECK(exp_avg.defined() && exp_avg_sq.defined(), "adam_step: exp_avg and exp_avg_sq are required");
  const int64_t n = grad.numel();
  if (n == 0) return;
  const int dev = grad.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(grad.dtype(), "adam_step", [&] {
    using C = compute_t<scalar_t>;
    adam_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        elem_ptr<C>(w), elem_ptr<const scalar_t>(grad), elem_ptr<C>(exp_avg), elem_ptr<C>(exp_avg_sq),
        param.defined() ? elem_ptr<scalar_t>(param) : nullptr, n, s);
    MG_CUDA_CHECK_LAUNCH("adam_kernel");
  });
}

void sgd_step(const Tensor& w, const Tensor& grad, const Tensor& momentum_buffer, const Tensor& param,
              const SgdStep& s) {
  check_step("sgd_step", w, grad, {&momentum_buffer}, param);
  MG_CHECK(s.momentum == 0 || momentum_buffer.defined(), "sgd_step: momentum needs a momentum buffer");
  const int64_t n = grad.numel();
  if (n == 0) return;
  const int dev = grad.device().index;
  DeviceGuard g(dev);
  MG_DISPATCH_FLOAT(grad.dtype(), "sgd_step", [&] {
    using C = compute_t<scalar_t>;
    sgd_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
        elem_ptr<C>(w), elem_ptr<const scalar_t>(grad), momentum_buffer.defined() ? elem_ptr<C>(momentum_buffer) : nullptr,
        param.defined() ? elem_ptr<scalar_t>(param) : nullptr, n, s);
    MG_CUDA_CHECK_LAUNCH("sgd_kernel");
  });
}

}  // namespace mg::cuda
