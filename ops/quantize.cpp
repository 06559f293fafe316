// quantize / dequantize kernels (CPU, f32 arithmetic; rounding half to even as the int8 GEMM's
// activation packing) with shape checks kept apart from the loops, so meta tensors get sizes only.
// quantize_per_tensor and both dequantizations also run on cuda:N (ops/cuda/quantize.cu, the same
// arithmetic); the per-channel weight quantization stays on the CPU (done once, before `.to()`).
#include "ops/quantize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cuda/int8_launchers.h"
#include "ops/int8_requant.h"
#include "ops/ops.h"

namespace mg {
namespace {

// w: (C, ...) floating with C > 0, on a cpu device (weights are quantized there, then moved).
void check_weight(const char* op, const Tensor& w) {
  MG_CHECK(w.defined() && is_floating(w.dtype()) && w.dim() >= 1 && w.size(0) > 0, op,
           ": expected a floating tensor (C, ...) with C > 0, got ",
           w.defined() ? shape_str(w.shape()) : std::string("an undefined tensor"));
  MG_CHECK(!w.device().is_cuda(), "quantize_per_channel: weights are quantized on a cpu device (then the quantized ",
           "model moves with .to()), got a tensor on ", w.device().str());
}

}  // namespace

Tensor per_channel_scales(const Tensor& w) {
  check_weight("per_channel_scales", w);
  const int64_t C = w.size(0), inner = w.numel() / C;
  Tensor scales = empty({C}, {.dtype = DType::f32, .device = w.device()});
  if (w.is_meta()) return scales;
  Tensor wf = contiguous(cast(w.detach(), DType::f32));
  const float* src = wf.data<float>();
  float* s = scales.data<float>();
  for (int64_t i = 0; i < wf.numel(); ++i)  // checked before the parallel loop (no throw inside it)
    MG_CHECK(std::isfinite(src[i]), "quantize_per_channel: channel ", i / inner, " holds a non-finite value ", src[i]);
  parallel_for(0, C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float* row = src + c * inner;
      float amax = 0.f;
      for (int64_t i = 0; i < inner; ++i) amax = std::max(amax, std::fabs(row[i]));
      s[c] = amax > 0.f ? amax / 127.f : 1.f;
    }
  });
  return scales;
}

QuantizedChannels quantize_per_channel(const Tensor& w) {
  check_weight("quantize_per_channel", w);
  return quantize_per_channel(w, per_channel_scales(w));
}

QuantizedChannels quantize_per_channel(const Tensor& w, const Tensor& scales) {
  check_weight("quantize_per_channel", w);
  MG_CHECK(scales.defined() && scales.dtype() == DType::f32 && scales.dim() == 1 && scales.size(0) == w.size(0),
           "quantize_per_channel: scales must be f32 (", w.size(0), "), got ",
           scales.defined() ? shape_str(scales.shape()) : std::string("an undefined tensor"));
  MG_CHECK(w.device() == scales.device(), "quantize_per_channel: weights on ", w.device().str(), ", scales on ",
           scales.device().str());
  const int64_t C = w.size(0), inner = w.numel() / C;
  QuantizedChannels out{empty(w.shape(), {.dtype = DType::i8, .device = w.device()}), contiguous(scales.detach())};
  if (w.is_meta()) return out;
  const float* s = out.scales.data<float>();
  for (int64_t c = 0; c < C; ++c)
    MG_CHECK(std::isfinite(s[c]) && s[c] > 0, "quantize_per_channel: scale ", c, " is ", s[c],
             " (must be positive and finite)");
  Tensor wf = contiguous(cast(w.detach(), DType::f32));
  const float* src = wf.data<float>();
  int8_t* q = out.values.data<int8_t>();
  parallel_for(0, C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < inner; ++i)
        q[c * inner + i] = int8_t(std::clamp(std::nearbyint(src[c * inner + i] / s[c]), -127.f, 127.f));
  });
  return out;
}

Tensor dequantize_per_channel(const Tensor& values, const Tensor& scales) {
  MG_CHECK(values.defined() && values.dtype() == DType::i8 && values.dim() >= 1,
           "dequantize_per_channel: values must be an i8 tensor (C, ...)");
  MG_CHECK(scales.defined() && scales.dtype() == DType::f32 && scales.dim() == 1 && scales.size(0) == values.size(0),
           "dequantize_per_channel: scales must be f32 (", values.size(0), "), got ",
           scales.defined() ? shape_str(scales.shape()) : std::string("an undefined tensor"));
  MG_CHECK(values.device() == scales.device(), "dequantize_per_channel: values on ", values.device().str(),
           ", scales on ", scales.device().str());
  Tensor out = empty(values.shape(), {.dtype = DType::f32, .device = values.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  Tensor v = contiguous(values), s = contiguous(scales);
  if (out.device().is_cuda()) {
    cuda::dequantize_per_channel(out, v, s);
    return out;
  }
  const int64_t C = v.size(0), inner = v.numel() / C;
  const int8_t* q = v.data<int8_t>();
  const float* sc = s.data<float>();
  float* o = out.data<float>();
  parallel_for(0, C, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < inner; ++i) o[c * inner + i] = float(q[c * inner + i]) * sc[c];
  });
  return out;
}

ActivationQParams choose_qparams_u8(float lo, float hi) {
  MG_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "choose_qparams_u8: invalid range [", lo, ", ", hi,
           "]\n  hint: the observer saw no finite values (no calibration batches, or NaN activations)");
  lo = std::min(lo, 0.f);
  hi = std::max(hi, 0.f);
  ActivationQParams p;
  p.scale = (hi - lo) / 255.f;
  if (!(p.scale > 0.f)) p.scale = 1.f;  // an all-zero range: any scale represents it exactly
  p.zero_point = int32_t(std::clamp(std::nearbyint(-lo / p.scale), 0.f, 255.f));
  return p;
}

Tensor quantize_per_tensor(const Tensor& x, ActivationQParams p) {
  MG_CHECK(x.defined() && is_floating(x.dtype()), "quantize_per_tensor: expected a floating tensor");
  MG_CHECK(p.scale > 0.f && std::isfinite(p.scale) && p.zero_point >= 0 && p.zero_point <= 255,
           "quantize_per_tensor: bad parameters scale ", p.scale, ", zero point ", p.zero_point);
  Tensor out = empty(x.shape(), {.dtype = DType::u8, .device = x.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  Tensor xf = contiguous(cast(x, DType::f32));
  const float inv = 1.f / p.scale;
  if (out.device().is_cuda()) {
    cuda::quantize_per_tensor(out, xf, inv, p.zero_point);
    return out;
  }
  const float* src = xf.data<float>();
  uint8_t* q = out.data<uint8_t>();
  parallel_for(0, out.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
    quantize_row_u8(src + i0, i1 - i0, inv, p.zero_point, q + i0);
  });
  return out;
}

Tensor dequantize_per_tensor(const Tensor& q, ActivationQParams p) {
  MG_CHECK(q.defined() && q.dtype() == DType::u8, "dequantize_per_tensor: expected a u8 tensor");
  Tensor out = empty(q.shape(), {.dtype = DType::f32, .device = q.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  Tensor qc = contiguous(q);
  if (out.device().is_cuda()) {
    cuda::dequantize_per_tensor(out, qc, p.scale, p.zero_point);
    return out;
  }
  const uint8_t* src = qc.data<uint8_t>();
  float* o = out.data<float>();
  parallel_for(0, out.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) o[i] = p.scale * float(int32_t(src[i]) - p.zero_point);
  });
  return out;
}

}  // namespace mg
