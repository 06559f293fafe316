// Int8OutlierLinear's forward: find the outlier columns, quantize the rest (outlier columns set to
// 0, which u8 quantization represents exactly, so they add nothing to the int8 product), run the
// int8 GEMM into y, then add the f32 product of the outlier columns. All scratch is workspace.
#include "models/compress/int8_outlier_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/memory_category.h"
#include "ops/ops.h"
#include "ops/quantize.h"

namespace mg {

Int8OutlierLinear::Int8OutlierLinear(int64_t in, int64_t out, bool with_bias, float threshold, Device device)
    : Linear("Int8OutlierLinear", in, out) {
  MG_CHECK(threshold >= 0 && !std::isnan(threshold), "Int8OutlierLinear: the outlier threshold must be >= 0 (or inf), got ",
           threshold);
  weight_int8 = register_buffer("weight_int8", zeros({out, in}, {.dtype = DType::i8, .device = device}));
  weight_scale = register_buffer("weight_scale", full({out}, 1.0, {.device = device}));
  outlier_threshold = register_buffer("outlier_threshold", full({1}, threshold, {.device = device}));
  if (with_bias) bias = register_buffer("bias", zeros({out}, {.device = device}));
}

std::shared_ptr<Int8OutlierLinear> Int8OutlierLinear::from_float(const Linear& src, float threshold) {
  auto m = std::make_shared<Int8OutlierLinear>(src.in_features, src.out_features, src.bias.defined(), threshold,
                                               src.weight.device());
  NoGradGuard ng;
  const QuantizedChannels q = quantize_per_channel(src.weight);
  copy_(m->weight_int8, q.values);
  copy_(m->weight_scale, q.scales);
  if (src.bias.defined()) copy_(m->bias, src.bias);
  return m;
}

float Int8OutlierLinear::threshold() const {
  const float t = outlier_threshold.data<float>()[0];
  MG_CHECK(t >= 0 && !std::isnan(t), "Int8OutlierLinear: invalid outlier threshold ", t, " (corrupt quantized file?)");
  return t;
}

Tensor Int8OutlierLinear::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features && x.dtype() == DType::f32,
           "Int8OutlierLinear: expected an f32 input (..., ", in_features, "), got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = empty(out_shape, {.device = x.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  MG_CHECK(x.device().is_cpu() && weight_int8.device().is_cpu(), "Int8OutlierLinear: runs on cpu devices only (the ",
           "outlier split is host code), got input on ", x.device().str(), ", weights on ", weight_int8.device().str());
  const float thr = threshold();
  if (!packed_.data.defined() || packed_version_ != weight_int8.version()) {
    MemoryCategoryGuard cat(MemoryCategory::parameter);
    packed_ = int8_pack_a(weight_int8);
    packed_version_ = weight_int8.version();
  }
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  const int64_t K = in_features, N = out_features, R = x.numel() / K;
  Tensor xr = clone(reshape(contiguous(x), {R, K}));  // (R, K), outlier columns zeroed below
  float* xp = xr.data<float>();
  // outlier columns: |x| > threshold in any row (LLM.int8()'s criterion)
  std::vector<int64_t> cols;
  std::vector<char> is_out(size_t(K), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) is_out[size_t(k)] |= std::fabs(xp[r * K + k]) > thr;
  for (int64_t k = 0; k < K; ++k)
    if (is_out[size_t(k)]) cols.push_back(k);
  const int64_t O = int64_t(cols.size());
  last_outlier_columns = O;
  last_rows = R;
  // the outlier slice x[:, O] (R, O) and dequantized weight columns W[:, O] (N, O), in f32
  Tensor xo, wo;
  if (O > 0) {
    xo = empty({R, O});
    wo = empty({N, O});
    float* xop = xo.data<float>();
    float* wop = wo.data<float>();
    const int8_t* wq = weight_int8.data<int8_t>();
    const float* ws_ = weight_scale.data<float>();
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < O; ++j) {
        xop[r * O + j] = xp[r * K + cols[size_t(j)]];
        xp[r * K + cols[size_t(j)]] = 0.f;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < O; ++j) wop[n * O + j] = float(wq[n * K + cols[size_t(j)]]) * ws_[n];
  }
  // dynamic per-tensor u8 quantization of the rest
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < R * K; ++i) lo = std::min(lo, xp[i]), hi = std::max(hi, xp[i]);
  MG_CHECK(std::isfinite(lo) && std::isfinite(hi), "Int8OutlierLinear: the input holds a non-finite value");
  const ActivationQParams q = choose_qparams_u8(lo, hi);
  Tensor rs = mul(weight_scale, double(q.scale));  // (N) the product's per-output scale
  // y (R, N) = W (N, K) . x^T (K, R), written transposed; with the bias
  int8_gemm_quantize_b(packed_, R, xp, {.group = 1, .group_stride = K, .col_stride = 0, .row_stride = 1},
                       1.f / q.scale, q.zero_point,
                       {.f32 = out.data<float>(),
                        .layout = {.group = 1, .group_stride = N, .col_stride = 0, .row_stride = 1},
                        .row_scale = rs.data<float>(),
                        .bias = bias.defined() ? bias.data<float>() : nullptr},
                       x.device());
  if (O > 0) {
    Tensor yo = matmul(xo, transpose(wo, 0, 1));  // (R, N) f32
    const float* yp = yo.data<float>();
    float* op = out.data<float>();
    for (int64_t i = 0; i < R * N; ++i) op[i] += yp[i];
  }
  return out;
}

int64_t quantize_gpt_int8_outlier(GPT& model, float threshold) {
  int64_t n = 0;
  auto swap = [&](Module& parent, const char* name, std::shared_ptr<Linear>& member) {
    MG_CHECK(member->type_name() == "Linear", "quantize_gpt_int8_outlier: '", name, "' is already a ",
             member->type_name(), "\n  hint: the model is already quantized");
    member = Int8OutlierLinear::from_float(*member, threshold);
    parent.replace_child(name, member);
    ++n;
  };
  for_each_block_linear(model, swap);
  return n;
}

}  // namespace mg
