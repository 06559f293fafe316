// Learned-scale fake quantization (ops/fake_quantize_learned.h). The forward is the fixed-scale op's
// own kernel (fake_quantize_per_channel / fake_quantize_per_tensor on detached inputs), so the two
// give the same bits by construction; this file adds the node. FakeQuantizeLearnedBackward saves x
// and the scale, not a mask: the scale's gradient needs x / s anyway, from which the range mask
// follows. For a weight, x is the parameter itself, so saving it costs no memory; for an
// activation it is 4 bytes per element where the fixed-scale op saves 1 (its mask).
// Both gradients come from one pass over x and dout in f32, on the CPU or on cuda:N
// (ops/cuda/fake_quantize.cu, the same element math: ops/kernels/fake_quantize.h); meta allocates
// only. The scale's sums run in f64 over fixed chunks (fq::kScaleGradChunk), added in chunk order,
// so they give the same bits with any number of threads; CUDA sums within a chunk in another
// (fixed) order, the one difference between the two backends.
#include "ops/fake_quantize_learned.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/cuda/int8_launchers.h"
#include "ops/fake_quantize.h"
#include "ops/kernels/fake_quantize.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

using fq::Grid;
using fq::ScaleDivision;

class FakeQuantizeLearnedBackward : public Node {
 public:
  FakeQuantizeLearnedBackward(const char* name, Grid grid, ScaleDivision division, double grad_factor)
      : name_(name), grid_(grid), division_(division), grad_factor_(grad_factor) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override;
  SavedTensor x{this}, scale{this};

 private:
  void backward_cpu(const Tensor& dx, const Tensor& ds, const Tensor& xf, const Tensor& gf, const Tensor& s) const;

  const char* name_;
  Grid grid_;
  ScaleDivision division_;
  double grad_factor_;
};

// x: (C, inner) as saved; dout like x; scale (C) (C = 1 per tensor) -> dx like x, dscale like scale.
std::vector<Tensor> FakeQuantizeLearnedBackward::apply(std::vector<Tensor>&& g) {
  OpNameGuard op(name_);
  const Tensor xs = x.unpack(), s = contiguous(scale.unpack());
  Tensor dx, ds;
  if (needs_input_grad(0)) dx = empty(xs.shape(), {.dtype = DType::f32, .device = xs.device()});
  if (needs_input_grad(1)) ds = empty(s.shape(), {.dtype = DType::f32, .device = s.device()});
  if (!xs.is_meta() && xs.numel() > 0) {
    Tensor xf, gf;
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);  // copies only for strided or non-f32 inputs
      xf = contiguous(cast(xs, DType::f32));
      gf = contiguous(cast(g[0].detach(), DType::f32));
    }
    if (xs.device().is_cuda()) {
      cuda::fake_quantize_learned_backward(dx, ds, xf, gf, s, grid_, division_, grad_factor_);
    } else {
      backward_cpu(dx, ds, xf, gf, s);
    }
  }
  if (dx.defined() && xs.dtype() != DType::f32) dx = cast(dx, xs.dtype());
  return {dx, ds};
}

// The CPU kernel of apply(): xf, gf contiguous f32 (C, inner), s (C); dx, ds allocated or undefined.
// partial (C, chunks): chunk k of channel c summed in f64 in element order, then the chunks of a
// channel added in index order.
void FakeQuantizeLearnedBackward::backward_cpu(const Tensor& dx, const Tensor& ds, const Tensor& xf, const Tensor& gf,
                                               const Tensor& s) const {
  constexpr int64_t kChunk = fq::kScaleGradChunk;
  const int64_t C = s.numel(), inner = xf.numel() / C, chunks = (inner + kChunk - 1) / kChunk;
  const float* xp = xf.data<float>();
  const float* gp = gf.data<float>();
  const float* sp = s.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  std::vector<double> partial(static_cast<size_t>(C * chunks), 0.0);  // (C, chunks), a few values
  const Grid q = grid_;
  const ScaleDivision division = division_;
  parallel_for(0, C * chunks, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t c = w / chunks, begin = c * inner + (w % chunks) * kChunk;
      const int64_t end = std::min(begin + kChunk, (c + 1) * inner);
      const float sc = sp[c], inv = 1.f / sc;
      double sum = 0.0;
      for (int64_t i = begin; i < end; ++i) {
        bool inside;
        const float coef = fq::lsq_coefficient(xp[i], sc, inv, q, division, inside);
        if (dxp) dxp[i] = inside ? gp[i] : 0.f;
        sum += double(gp[i] * coef);
      }
      partial[size_t(w)] = sum;
    }
  });
  if (!ds.defined()) return;
  float* dsp = ds.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0.0;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[size_t(c * chunks + k)];
    dsp[c] = float(sum * grad_factor_);
  }
}

void check_input(const char* op, const Tensor& x) {
  check_defined(op, x, "input");
  check_floating(op, x);
}

std::string describe(const Tensor& t) {
  return t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()) : "an undefined tensor";
}

// scale: f32 of `channels` elements on x's device, each positive and finite (read unless on meta).
void check_scale(const char* op, const Tensor& x, const Tensor& scale, int64_t channels, double grad_factor) {
  MG_CHECK(scale.defined() && scale.dtype() == DType::f32 && scale.dim() == 1 && scale.size(0) == channels, op,
           ": scale must be f32 (", channels, "), got ", describe(scale));
  check_same_device(op, x, scale);
  MG_CHECK(std::isfinite(grad_factor) && grad_factor > 0, op, ": grad_factor must be positive and finite, got ",
           grad_factor);
  if (scale.is_meta()) return;
  Tensor s;  // read on the host: a copy of `channels` floats from cuda:N
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    s = contiguous(scale.device().is_cuda() ? to(scale.detach(), kCPU) : scale.detach());
  }
  const float* sp = s.data<float>();
  for (int64_t c = 0; c < channels; ++c)
    MG_CHECK(std::isfinite(sp[c]) && sp[c] > 0, op, ": scale ", c, " is ", sp[c],
             " (must be positive and finite)\n  hint: a learned scale is kept positive by its owner (FakeQuantLayer "
             "clamps it to a small epsilon before each forward)");
}

// The fixed-scale op's output `out` (computed on detached inputs) with this op's node attached.
Tensor with_node(const char* node_name, const Tensor& x, const Tensor& scale, Tensor out, Grid grid,
                 ScaleDivision division, double grad_factor) {
  if (!any_requires_grad({x, scale})) return out;
  auto node = std::make_shared<FakeQuantizeLearnedBackward>(node_name, grid, division, grad_factor);
  node->x.save(x);
  node->scale.save(scale);
  set_history(node, {x, scale}, {out});
  return out;
}

}  // namespace

Tensor fake_quantize_learned_per_tensor(const Tensor& x, const Tensor& scale, int32_t zero_point, double grad_factor) {
  const char* op = "fake_quantize_learned_per_tensor";
  check_input(op, x);
  check_scale(op, x, scale, 1, grad_factor);
  MG_CHECK(zero_point >= 0 && zero_point <= 255, op, ": zero point ", zero_point, " is outside [0, 255]");
  OpNameGuard name(op);
  const ActivationQParams q{.scale = scale.is_meta() ? 1.f : scale.item<float>(), .zero_point = zero_point};
  Tensor out = fake_quantize_per_tensor(x.detach(), q);
  return with_node("FakeQuantizeLearnedPerTensorBackward", x, scale, out,
                   {.qmin = 0.f, .qmax = 255.f, .zero = float(zero_point)}, ScaleDivision::by_inverse, grad_factor);
}

Tensor fake_quantize_learned_per_channel(const Tensor& w, const Tensor& scales, double grad_factor) {
  const char* op = "fake_quantize_learned_per_channel";
  check_input(op, w);
  MG_CHECK(w.dim() >= 1 && w.size(0) > 0, op, ": expected a weight (C, ...) with C > 0, got ", shape_str(w.shape()));
  check_scale(op, w, scales, w.size(0), grad_factor);
  OpNameGuard name(op);
  Tensor out = fake_quantize_per_channel(w.detach(), scales.detach());
  return with_node("FakeQuantizeLearnedPerChannelBackward", w, scales, out,
                   {.qmin = -127.f, .qmax = 127.f, .zero = 0.f}, ScaleDivision::exact, grad_factor);
}

}  // namespace mg
