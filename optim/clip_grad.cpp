// Global gradient norm and clipping. Each gradient is cut into fixed chunks; each chunk's sum of
// squares lands in its own slot and the slots are added in order, so threads never share an
// accumulator and the result is the same with 1 or 16 threads.
#include "optim/clip_grad.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/parallel.h"
#include "ops/ops.h"

namespace mg {
namespace {

constexpr int64_t kChunk = 1 << 14;

double sum_of_squares(const Tensor& g0) {
  if (g0.is_meta() || g0.numel() == 0) return 0.0;
  if (g0.device().is_cuda()) {
    // On the device, in f64 (as the host sums): only the scalar result crosses to the host.
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    const Tensor x = cast(g0.detach(), DType::f64);
    return mg::to(sum(mul(x, x)), kCPU).item<double>();
  }
  MG_CHECK(g0.device().is_cpu(), "clip_grad_norm: no kernel for device ", g0.device().str());
  Tensor g = g0;
  if (!g.is_contiguous()) {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    g = contiguous(g0.detach());
  }
  const int64_t n = g.numel(), chunks = (n + kChunk - 1) / kChunk;
  // One f64 per 16K elements: tiny next to the gradient itself, so a plain vector is fine.
  std::vector<double> partial(size_t(chunks), 0.0);
  MG_DISPATCH_FLOAT(g.dtype(), "clip_grad_norm", [&] {
    const scalar_t* d = g.data<scalar_t>();
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        double acc = 0.0;
        for (int64_t i = c * kChunk, e = std::min(n, (c + 1) * kChunk); i < e; ++i) {
          const double x = double(static_cast<compute_t<scalar_t>>(d[i]));
          acc += x * x;
        }
        partial[size_t(c)] = acc;
      }
    });
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale_(const Tensor& g, double factor) {
  if (g.is_meta() || g.numel() == 0) return;
  if (g.device().is_cuda()) {  // on the device, in the compute dtype, written back in place
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    const DType c = g.dtype() == DType::f64 ? DType::f64 : DType::f32;
    copy_(g, mul(cast(g.detach(), c), factor));
    g.bump_version();
    return;
  }
  MG_CHECK(g.device().is_cpu(), "clip_grad_norm: no kernel for device ", g.device().str());
  Tensor flat = g;
  MG_CHECK(g.is_contiguous(), "clip_grad_norm: gradient of shape ", shape_str(g.shape()),
           " is not contiguous and cannot be scaled in place");
  MG_DISPATCH_FLOAT(g.dtype(), "clip_grad_norm", [&] {
    using C = compute_t<scalar_t>;
    scalar_t* d = flat.data<scalar_t>();
    const C f = C(factor);
    parallel_for(0, g.numel(), kChunk, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = scalar_t(C(d[i]) * f);
    });
  });
  g.bump_version();
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  double total = 0.0;
  for (const auto& p : params)
    if (p.defined() && p.grad().defined()) total += sum_of_squares(p.grad());
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) { return clip_grad_norm(params, max_norm, {}); }

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm,
                      const std::function<double(double)>& sum_sq_across) {
  MG_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  NoGradGuard no_grad;
  double norm = grad_norm(params);
  if (sum_sq_across) norm = std::sqrt(sum_sq_across(norm * norm));
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const auto& p : params)
      if (p.defined() && p.grad().defined()) scale_(p.grad(), coef);
  return norm;
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  std::vector<Tensor> ts;
  for (const auto& [_, p] : params) ts.push_back(p);
  return clip_grad_norm(ts, max_norm);
}

}  // namespace mg
