// The quantized layers' construction (quantizing a float layer, or empty for loading) and forward.
// A full-int8 layer packs nothing ahead: the GEMM reads weight_int8 in place, and only the row
// sums (Cout i32, parameter memory) are cached, recomputed when weight_int8's version changes
// (a load_state_dict writes into it).
#include "models/compress/quant_modules.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/memory_category.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Host pointers work across cpu:N pools; a GPU's memory only on that GPU.
bool same_memory(Device a, Device b) { return a == b || (a.is_cpu() && b.is_cpu()); }

Tensor zeros_on(const Shape& s, DType dt, Device d) { return zeros(s, {.dtype = dt, .device = d}); }

// The buffers get copies (quantize_per_channel's outputs are activation memory) of w quantized with
// `scales`, or with max|w_c| / 127 when undefined.
void set_weights(Tensor& q_member, Tensor& s_member, const Tensor& w, const Tensor& scales) {
  const QuantizedChannels q = scales.defined() ? quantize_per_channel(w, scales) : quantize_per_channel(w);
  copy_(q_member, q.values);
  copy_(s_member, q.scales);
}

// Per-output-channel scale of the whole product: w_scale[m] * input scale, workspace (Cout) f32 on
// w_scale's device (computed on the host, one f32 product each, and copied to a GPU).
Tensor row_scales(const Tensor& w_scale, float in_scale) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  const Tensor src = w_scale.device().is_cpu() ? w_scale : to(w_scale, kCPU);
  Tensor r = empty({w_scale.size(0)}, {.device = src.device()});
  const float* s = src.data<float>();
  float* o = r.data<float>();
  for (int64_t i = 0; i < r.numel(); ++i) o[i] = s[i] * in_scale;
  return w_scale.device().is_cpu() ? r : to(r, w_scale.device());
}

Tensor dequantized(const Tensor& q, const Tensor& s) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return dequantize_per_channel(q, s);
}

// Row sums are recomputed when the weight changed: a new version (load_state_dict) or new memory
// (Module::to moved it to another device).
void refresh_packed(const Tensor& w2d, Int8PackedA& packed, uint64_t& version, const Tensor& owner_weight) {
  if (packed.data.defined() && version == owner_weight.version() && packed.data.data_ptr() == w2d.data_ptr() &&
      packed.row_sums.device() == w2d.device())
    return;
  MemoryCategoryGuard cat(MemoryCategory::parameter);
  packed = int8_pack_a(w2d);
  version = owner_weight.version();
}

}  // namespace

void Int8Input::init(Module& owner, ActivationQParams q, Device device) {
  scale = owner.register_buffer("input_scale", full({1}, q.scale, {.dtype = DType::f32, .device = device}));
  zero_point = owner.register_buffer("input_zero_point", full({1}, q.zero_point, {.dtype = DType::i32, .device = device}));
}

ActivationQParams Int8Input::get(const char* who) const {
  ActivationQParams q{scale.item<float>(), zero_point.item<int32_t>()};  // from any device
  MG_CHECK(std::isfinite(q.scale) && q.scale > 0 && q.zero_point >= 0 && q.zero_point <= 255, who,
           ": invalid input quantization (scale ", q.scale, ", zero point ", q.zero_point,
           "): scale must be positive and finite, zero point in [0, 255]");
  return q;
}

// ---- Int8WeightOnlyLinear -------------------------------------------------------------------

Int8WeightOnlyLinear::Int8WeightOnlyLinear(int64_t in, int64_t out, bool with_bias, Device device)
    : Linear("Int8WeightOnlyLinear", in, out) {
  weight_int8 = register_buffer("weight_int8", zeros_on({out, in}, DType::i8, device));
  weight_scale = register_buffer("weight_scale", full({out}, 1.0, {.device = device}));
  if (with_bias) bias = register_buffer("bias", zeros_on({out}, DType::f32, device));
}

std::shared_ptr<Int8WeightOnlyLinear> Int8WeightOnlyLinear::from_float(const Linear& src) {
  auto m = std::make_shared<Int8WeightOnlyLinear>(src.in_features, src.out_features, src.bias.defined(),
                                                  src.weight.device());
  NoGradGuard ng;
  set_weights(m->weight_int8, m->weight_scale, src.weight, Tensor());
  if (src.bias.defined()) copy_(m->bias, src.bias);
  return m;
}

Tensor Int8WeightOnlyLinear::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features, "Int8WeightOnlyLinear: expected input (..., ",
           in_features, "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  Tensor w = dequantized(weight_int8, weight_scale);
  return linear(x, w, bias);
}

// ---- Int8Linear -----------------------------------------------------------------------------

Int8Linear::Int8Linear(int64_t in, int64_t out, bool with_bias, Device device) : Linear("Int8Linear", in, out) {
  weight_int8 = register_buffer("weight_int8", zeros_on({out, in}, DType::i8, device));
  weight_scale = register_buffer("weight_scale", full({out}, 1.0, {.device = device}));
  if (with_bias) bias = register_buffer("bias", zeros_on({out}, DType::f32, device));
  input.init(*this, {}, device);
}

std::shared_ptr<Int8Linear> Int8Linear::from_float(const Linear& src, ActivationQParams in_q,
                                                   const Tensor& weight_scales) {
  auto m = std::make_shared<Int8Linear>(src.in_features, src.out_features, src.bias.defined(), src.weight.device());
  NoGradGuard ng;
  set_weights(m->weight_int8, m->weight_scale, src.weight, weight_scales);
  if (src.bias.defined()) copy_(m->bias, src.bias);
  fill_(m->input.scale, in_q.scale);
  fill_(m->input.zero_point, in_q.zero_point);
  return m;
}

Tensor Int8Linear::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features && x.dtype() == DType::f32,
           "Int8Linear: expected an f32 input (..., ", in_features, "), got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  MG_CHECK(same_memory(x.device(), weight_int8.device()), "Int8Linear: input on ", x.device().str(), ", weights on ",
           weight_int8.device().str());
  const ActivationQParams q = input.get("Int8Linear");
  refresh_packed(weight_int8, packed_, packed_version_, weight_int8);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = empty(out_shape, {.device = x.device()});
  if (out.is_meta() || out.numel() == 0) return out;
  Tensor xc = contiguous(x);
  const int64_t rows = xc.numel() / in_features;
  Tensor rs = row_scales(weight_scale, q.scale);
  // C (out, rows) = W (out, in) . x^T (in, rows), written transposed into y (rows, out)
  int8_gemm_quantize_b(packed_, rows, xc.data<float>(),
                       {.group = 1, .group_stride = in_features, .col_stride = 0, .row_stride = 1}, 1.f / q.scale,
                       q.zero_point,
                       {.f32 = out.data<float>(),
                        .layout = {.group = 1, .group_stride = out_features, .col_stride = 0, .row_stride = 1},
                        .row_scale = rs.data<float>(),
                        .bias = bias.defined() ? bias.data<float>() : nullptr},
                       x.device());
  return out;
}

// ---- Int8ConvBase ---------------------------------------------------------------------------

Int8ConvBase::Int8ConvBase(const char* type, int64_t in, int64_t out, Shape weight_shape, bool with_bias, Device device)
    : UnaryModule(type), in_channels(in), out_channels(out) {
  MG_CHECK(in > 0 && out > 0, type, ": channel counts must be positive, got ", in, ", ", out);
  weight_int8 = register_buffer("weight_int8", zeros_on(weight_shape, DType::i8, device));
  weight_scale = register_buffer("weight_scale", full({out}, 1.0, {.device = device}));
  if (with_bias) bias = register_buffer("bias", zeros_on({out}, DType::f32, device));
  input.init(*this, {}, device);
}

void Int8ConvBase::check_input(const Tensor& x) const {
  MG_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_channels && (x.dtype() == DType::f32 || x.dtype() == DType::u8),
           type_name(), ": expected an f32 or u8 input (N, ", in_channels, ", H, W), got ",
           x.defined() ? shape_str(x.shape()) + " " + std::string(dtype_name(x.dtype())) : std::string("an undefined tensor"));
  MG_CHECK(same_memory(x.device(), weight_int8.device()), type_name(), ": input on ", x.device().str(), ", weights on ",
           weight_int8.device().str());
}

Tensor Int8ConvBase::empty_output(const Shape& shape, Device device) const {
  return empty(shape, {.dtype = next_input_ ? DType::u8 : DType::f32, .device = device});
}

Requant Int8ConvBase::requant() const {
  Requant q;
  if (fused_relu6) q.lo = 0.f, q.hi = 6.f;
  if (next_input_) {
    const ActivationQParams o = next_input_->get(type_name().c_str());
    q.out_inv_scale = 1.f / o.scale;
    q.out_zero = o.zero_point;
  }
  return q;
}

void Int8ConvBase::set_from(const Conv2d& src, ActivationQParams in_q, const Tensor& weight_scales) {
  NoGradGuard ng;
  set_weights(weight_int8, weight_scale, src.weight, weight_scales);
  if (src.bias.defined()) copy_(bias, src.bias);
  fill_(input.scale, in_q.scale);
  fill_(input.zero_point, in_q.zero_point);
}

// ---- Int8Conv2d -----------------------------------------------------------------------------

Int8Conv2d::Int8Conv2d(int64_t in, int64_t out, bool with_bias, Device device)
    : Int8ConvBase("Int8Conv2d", in, out, {out, in, 1, 1}, with_bias, device) {}

bool Int8Conv2d::supports(const Conv2d& c) {
  return c.kernel_size == 1 && c.params.stride == 1 && c.params.padding == 0 && c.params.groups == 1;
}

std::shared_ptr<Int8Conv2d> Int8Conv2d::from_float(const Conv2d& src, ActivationQParams in_q, const Tensor& weight_scales) {
  MG_CHECK(supports(src), "Int8Conv2d: only 1x1, stride 1, padding 0, ungrouped convolutions run on the int8 GEMM; got ",
           src.kernel_size, "x", src.kernel_size, " stride ", src.params.stride, " groups ", src.params.groups);
  auto m = std::make_shared<Int8Conv2d>(src.in_channels, src.out_channels, src.bias.defined(), src.weight.device());
  m->set_from(src, in_q, weight_scales);
  return m;
}

Tensor Int8Conv2d::forward(const Tensor& x) {
  auto scope = forward_scope();
  check_input(x);
  const ActivationQParams q = input.get("Int8Conv2d");
  refresh_packed(weight_int8.as_strided({out_channels, in_channels}, {in_channels, 1}, weight_int8.storage_offset()),
                 packed_, packed_version_, weight_int8);
  const int64_t N = x.size(0), HW = x.size(2) * x.size(3);
  Tensor out = empty_output({N, out_channels, x.size(2), x.size(3)}, x.device());
  if (out.is_meta() || out.numel() == 0) return out;
  Tensor xc = contiguous(x);
  Tensor rs = row_scales(weight_scale, q.scale);
  const Requant r = requant();
  Int8GemmOut o{.layout = {.group = HW, .group_stride = out_channels * HW, .col_stride = 1, .row_stride = HW},
                .row_scale = rs.data<float>(),
                .bias = bias.defined() ? bias.data<float>() : nullptr,
                .clamp_lo = r.lo,
                .clamp_hi = r.hi,
                .out_inv_scale = r.out_inv_scale,
                .out_zero = r.out_zero};
  if (out.dtype() == DType::u8) o.u8 = out.data<uint8_t>();
  else o.f32 = out.data<float>();
  // C (Cout, N*HW) = W (Cout, Cin) . X (Cin, N*HW), X and C in NCHW
  const Int8Layout in_layout{.group = HW, .group_stride = in_channels * HW, .col_stride = 1, .row_stride = HW};
  if (xc.dtype() == DType::u8)
    int8_gemm(packed_, N * HW, xc.data<uint8_t>(), in_layout, q.zero_point, o, x.device());
  else
    int8_gemm_quantize_b(packed_, N * HW, xc.data<float>(), in_layout, 1.f / q.scale, q.zero_point, o, x.device());
  return out;
}

// ---- Int8DepthwiseConv2d --------------------------------------------------------------------

Int8DepthwiseConv2d::Int8DepthwiseConv2d(int64_t channels, int64_t k, Conv2dParams p, bool with_bias, Device device)
    : Int8ConvBase("Int8DepthwiseConv2d", channels, channels, {channels, 1, k, k}, with_bias, device),
      kernel_size(k),
      params(p) {
  MG_CHECK(k > 0 && p.stride > 0 && p.padding >= 0 && p.groups == channels, "Int8DepthwiseConv2d: invalid kernel ", k,
           " stride ", p.stride, " padding ", p.padding, " groups ", p.groups, " for ", channels, " channels");
}

bool Int8DepthwiseConv2d::supports(const Conv2d& c) {
  return c.params.groups == c.in_channels && c.in_channels == c.out_channels;
}

std::shared_ptr<Int8DepthwiseConv2d> Int8DepthwiseConv2d::from_float(const Conv2d& src, ActivationQParams in_q,
                                                                     const Tensor& weight_scales) {
  MG_CHECK(supports(src), "Int8DepthwiseConv2d: needs groups == in == out channels, got groups ", src.params.groups,
           " in ", src.in_channels, " out ", src.out_channels);
  auto m = std::make_shared<Int8DepthwiseConv2d>(src.in_channels, src.kernel_size, src.params, src.bias.defined(),
                                                 src.weight.device());
  m->set_from(src, in_q, weight_scales);
  return m;
}

Tensor Int8DepthwiseConv2d::forward(const Tensor& x) {
  auto scope = forward_scope();
  check_input(x);
  const ActivationQParams q = input.get("Int8DepthwiseConv2d");
  const Int8DepthwiseShape s{.N = x.size(0), .C = in_channels, .H = x.size(2), .W = x.size(3), .K = kernel_size,
                             .stride = params.stride, .padding = params.padding};
  MG_CHECK(s.H + 2 * s.padding >= s.K && s.W + 2 * s.padding >= s.K, "Int8DepthwiseConv2d: input ",
           shape_str(x.shape()), " is smaller than the ", s.K, "x", s.K, " kernel with padding ", s.padding);
  Tensor out = empty_output({s.N, s.C, s.OH(), s.OW()}, x.device());
  if (out.is_meta() || out.numel() == 0) return out;
  Tensor xq = x.dtype() == DType::u8 ? contiguous(x) : quantize_per_tensor(contiguous(x), q);
  Tensor rs = row_scales(weight_scale, q.scale);
  Int8DepthwiseOut o{.scale = rs.data<float>(), .bias = bias.defined() ? bias.data<float>() : nullptr, .q = requant()};
  if (out.dtype() == DType::u8) o.u8 = out.data<uint8_t>();
  else o.f32 = out.data<float>();
  int8_depthwise(s, xq.data<uint8_t>(), q.zero_point, weight_int8.data<int8_t>(), o, x.device());
  return out;
}

// ---- Int8WeightOnlyConv2d -------------------------------------------------------------------

Int8WeightOnlyConv2d::Int8WeightOnlyConv2d(int64_t in, int64_t out, int64_t k, Conv2dParams p, bool with_bias,
                                           Device device)
    : UnaryModule("Int8WeightOnlyConv2d"), in_channels(in), out_channels(out), kernel_size(k), params(p) {
  MG_CHECK(in > 0 && out > 0 && k > 0 && p.groups > 0 && in % p.groups == 0,
           "Int8WeightOnlyConv2d: invalid sizes in ", in, " out ", out, " kernel ", k, " groups ", p.groups);
  weight_int8 = register_buffer("weight_int8", zeros_on({out, in / p.groups, k, k}, DType::i8, device));
  weight_scale = register_buffer("weight_scale", full({out}, 1.0, {.device = device}));
  if (with_bias) bias = register_buffer("bias", zeros_on({out}, DType::f32, device));
}

std::shared_ptr<Int8WeightOnlyConv2d> Int8WeightOnlyConv2d::from_float(const Conv2d& src, const Tensor& weight_scales) {
  auto m = std::make_shared<Int8WeightOnlyConv2d>(src.in_channels, src.out_channels, src.kernel_size, src.params,
                                                  src.bias.defined(), src.weight.device());
  NoGradGuard ng;
  set_weights(m->weight_int8, m->weight_scale, src.weight, weight_scales);
  if (src.bias.defined()) copy_(m->bias, src.bias);
  return m;
}

Tensor Int8WeightOnlyConv2d::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_channels, "Int8WeightOnlyConv2d: expected input (N, ",
           in_channels, ", H, W), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  Tensor w = dequantized(weight_int8, weight_scale);
  return conv2d(x, w, bias, params);
}

}  // namespace mg
