// Fake quantization (ops/fake_quantize.h). The forward writes the fake-quantized values and, only
// when a gradient is needed, a bool mask of the elements inside the range; FakeQuantizeBackward
// saves that mask (1 byte per element instead of the 4 of the f32 input) and nothing else.
// Computed in f32 on the CPU (inputs of other floating types are cast, the output cast back); on
// meta the outputs are allocated and nothing is computed. No CUDA kernel yet: a clear error.
#include "ops/fake_quantize.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/int8_requant.h"
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
  MG_CHECK(!x.device().is_cuda(), op, ": not implemented on ", x.device().str(),
           " (quantization-aware training runs on cpu devices)");
}

// out (and mask when wanted) for x: kernel(xf, of, mask or null) fills them from f32 data.
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
    kernel(xf.data<float>(), out.data<float>(), wants_grad ? mask.data<bool>() : nullptr);
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
    const float* sp = s.data<float>();
    for (int64_t c = 0; c < s.numel(); ++c)
      MG_CHECK(std::isfinite(sp[c]) && sp[c] > 0, op, ": scale ", c, " is ", sp[c], " (must be positive and finite)");
  }
  const int64_t C = w.size(0), inner = w.numel() / C;
  return run(op, "FakeQuantizePerChannelBackward", w, [&](const float* x, float* o, bool* m) {
    const float* sp = s.data<float>();
    parallel_for(0, C, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t i = c * inner; i < (c + 1) * inner; ++i) {
          const float r = std::nearbyint(x[i] / sp[c]);  // quantize_per_channel's arithmetic
          o[i] = float(int8_t(std::clamp(r, -127.f, 127.f))) * sp[c];
          if (m) m[i] = r >= -127.f && r <= 127.f;
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
  return run(op, "FakeQuantizePerTensorBackward", x, [&](const float* xp, float* o, bool* m) {
    parallel_for(0, x.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const uint8_t u = quantize_u8(xp[i], inv, q.zero_point);
        o[i] = q.scale * float(int32_t(u) - q.zero_point);  // dequantize_per_tensor's arithmetic
        if (m) {
          const float r = std::nearbyint(xp[i] * inv) + float(q.zero_point);
          m[i] = r >= 0.f && r <= 255.f;
        }
      }
    });
  });
}

}  // namespace mg
