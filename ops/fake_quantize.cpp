// Fake quantization (ops/fake_quantize.h). The forward writes the fake-quantized values and, only
// when a gradient is needed, a bool mask of the elements inside the range; FakeQuantizeBackward
// saves that mask (1 byte per element instead of the 4 of the f32 input) and nothing else.
// Computed in f32 (inputs of other floating types are cast, the output cast back) on the CPU and on
// cuda:N (ops/cuda/fake_quantize.cu) with the same element math (ops/kernels/fake_quantize.h), so
// the two give the same bits; on meta the outputs are allocated and nothing is computed.
#include "ops/fake_quantize.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/cuda/int8_launchers.h"
#include "ops/kernels/fake_quantize.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

// dx = dout where mask, 0 elsewhere.
class FakeQuantizeBackward : public Node {
 public:
  explicit FakeQuantizeBackward(const char* name) : name_(name) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
    return {where(mask.unpack(), g[0], zero)};
  }
  SavedTensor mask{this};

 private:
  const char* name_;
};

void check_input(const char* op, const Tensor& x) {
  check_defined(op, x, "input");
  check_floating(op, x);
}

// out (and mask when wanted) for x: kernel(xf, out, mask) fills them from x as contiguous f32 (mask
// undefined when no gradient is wanted), on x's device.
template <class Kernel>
Tensor run(const char* op, const char* node_name, const Tensor& x, Kernel&& kernel) {
  OpNameGuard name(op);
  const bool wants_grad = any_requires_grad({x});
  Tensor out = empty(x.shape(), {.dtype = DType::f32, .device = x.device()});
  Tensor mask;
  if (wants_grad) mask = empty(x.shape(), {.dtype = DType::b8, .device = x.device()});
  if (!skip_kernel(out)) {
    Tensor xf;
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);  // a copy only for a strided or non-f32 x
      xf = contiguous(cast(x.detach(), DType::f32));
    }
    kernel(xf, out, mask);
  }
  if (x.dtype() != DType::f32) out = cast(out, x.dtype());
  if (wants_grad) {
    auto node = std::make_shared<FakeQuantizeBackward>(node_name);
    node->mask.save(mask);
    set_history(node, {x}, {out});
  }
  return out;
}

}  // namespace

Tensor fake_quantize_per_channel(const Tensor& w, const Tensor& scales) {
  const char* op = "fake_quantize_per_channel";
  check_input(op, w);
  MG_CHECK(w.dim() >= 1 && w.size(0) > 0, op, ": expected a weight (C, ...) with C > 0, got ", shape_str(w.shape()));
  MG_CHECK(scales.defined() && scales.dtype() == DType::f32 && scales.dim() == 1 && scales.size(0) == w.size(0), op,
           ": scales must be f32 (", w.size(0), "), got ",
           scales.defined() ? std::string(dtype_name(scales.dtype())) + " " + shape_str(scales.shape())
                            : std::string("an undefined tensor"));
  check_same_device(op, w, scales);
  Tensor s;
  if (!w.is_meta()) {
    s = contiguous(scales.detach());
    Tensor host;  // the checks read the scales on the host: a copy of C floats from cuda:N
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);
      host = s.device().is_cuda() ? to(s, kCPU) : s;
    }
    const float* sp = host.data<float>();
    for (int64_t c = 0; c < host.numel(); ++c)
      MG_CHECK(std::isfinite(sp[c]) && sp[c] > 0, op, ": scale ", c, " is ", sp[c], " (must be positive and finite)");
  }
  const int64_t C = w.size(0), inner = w.numel() / C;
  return run(op, "FakeQuantizePerChannelBackward", w, [&](const Tensor& xt, const Tensor& out, const Tensor& mask) {
    if (xt.device().is_cuda()) return cuda::fake_quantize_per_channel(out, mask, xt, s);
    const float* x = xt.data<float>();
    const float* sp = s.data<float>();
    float* o = out.data<float>();
    bool* m = mask.defined() ? mask.data<bool>() : nullptr;
    parallel_for(0, C, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t i = c * inner; i < (c + 1) * inner; ++i) {
          bool inside;
          o[i] = fq::symmetric_s8(x[i], sp[c], inside);
          if (m) m[i] = inside;
        }
    });
  });
}

Tensor fake_quantize_per_tensor(const Tensor& x, ActivationQParams q) {
  const char* op = "fake_quantize_per_tensor";
  check_input(op, x);
  MG_CHECK(std::isfinite(q.scale) && q.scale > 0 && q.zero_point >= 0 && q.zero_point <= 255, op,
           ": invalid quantization (scale ", q.scale, ", zero point ", q.zero_point,
           "): scale must be positive and finite, zero point in [0, 255]");
  const float inv = 1.f / q.scale;  // quantize_u8 multiplies by the inverse, as the int8 GEMM's packing
  return run(op, "FakeQuantizePerTensorBackward", x, [&](const Tensor& xt, const Tensor& out, const Tensor& mask) {
    if (xt.device().is_cuda()) return cuda::fake_quantize_per_tensor(out, mask, xt, q.scale, inv, q.zero_point);
    const float* xp = xt.data<float>();
    float* o = out.data<float>();
    bool* m = mask.defined() ? mask.data<bool>() : nullptr;
    parallel_for(0, x.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        bool inside;
        o[i] = fq::affine_u8(xp[i], q.scale, inv, q.zero_point, inside);
        if (m) m[i] = inside;
      }
    });
  });
}

}  // namespace mg
