// Post-training quantization (models/compress/quant_*): the quantize ops, the observers,
// BatchNorm folding (folded equals unfolded in eval), the full-int8 layers against a dequantized
// f32 reference, MobileNetV2 PTQ and GPT weight-only close to fp32 with fewer weight bytes, the
// quantized file round trip (bit-identical outputs) and the errors: no calibration, quantizing
// twice, corrupt files (no metadata, missing scale, wrong shape, bad scale, bad layer list).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mg_quant_" + std::to_string(::getpid()) + "_" + name)).string();
}

MobileNetV2Config tiny_net() { return {.width_mult = 0.25, .num_classes = 10, .small_input = true, .dropout = 0.0, .input_size = 32}; }

// Random BatchNorm statistics and affine parameters, so folding has something to fold.
void randomize_batch_norms(Module& m, uint64_t seed) {
  NoGradGuard ng;
  for (auto& [name, mod] : m.named_modules())
    if (auto* bn = dynamic_cast<BatchNorm2d*>(mod)) {
      const int64_t C = bn->num_features;
      copy_(bn->weight, rand_tensor({C}, seed++, DType::f32, 0.5, 1.5));
      copy_(bn->bias, rand_tensor({C}, seed++, DType::f32, -0.2, 0.2));
      copy_(bn->running_mean, rand_tensor({C}, seed++, DType::f32, -0.1, 0.1));
      copy_(bn->running_var, rand_tensor({C}, seed++, DType::f32, 0.5, 2.0));
    }
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

double max_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_double_vector(), y = b.to_double_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// A tiny MobileNetV2 folded, calibrated on two batches and converted.
// The same weights every call (seeded generator).
std::shared_ptr<MobileNetV2> float_net() {
  Generator g(21);
  auto net = std::make_shared<MobileNetV2>(tiny_net(), InitOptions{.gen = &g});
  randomize_batch_norms(*net, 11);
  net->eval();
  return net;
}

std::shared_ptr<MobileNetV2> quantized_net(ObserverKind kind = ObserverKind::minmax) {
  auto net = float_net();
  NoGradGuard ng;
  fold_batch_norms(*net);
  prepare_ptq(*net, {.kind = kind});
  for (uint64_t s : {1, 2}) (*net)(rand_tensor({4, 3, 32, 32}, s, DType::f32));
  convert_ptq(*net);
  return net;
}

}  // namespace

TEST_CASE("quantize_per_channel: symmetric, error at most half a step, zero channel", "[quant]") {
  Tensor w = rand_tensor({5, 3, 2}, 3, DType::f32, -2, 2);
  { NoGradGuard ng; fill_(w.as_strided({6}, {1}, 12), 0.0); }  // channel 2 all zeros
  QuantizedChannels q = quantize_per_channel(w);
  REQUIRE(q.values.dtype() == DType::i8);
  REQUIRE(q.scales.shape() == Shape{5});
  REQUIRE(q.scales.to_vector<float>()[2] == 1.f);
  const auto wv = w.to_double_vector(), dq = dequantize_per_channel(q.values, q.scales).to_double_vector();
  const auto s = q.scales.to_double_vector(), qv = q.values.to_double_vector();
  for (size_t i = 0; i < wv.size(); ++i) {
    CHECK(std::abs(wv[i] - dq[i]) <= 0.5 * s[i / 6] * (1 + 1e-6));
    CHECK(std::abs(qv[i]) <= 127);
  }
  CHECK(max_abs(qv) == 127);  // the largest weight of a channel maps to +-127
  Tensor bad = from_vector(std::vector<double>{1.0, NAN}, {2, 1}, {});
  CHECK_THROWS_WITH(quantize_per_channel(bad), Catch::Contains("non-finite"));
  QuantizedChannels m = quantize_per_channel(empty({7, 4}, {.device = kMeta}));
  CHECK((m.values.is_meta() && m.values.shape() == Shape{7, 4} && m.scales.shape() == Shape{7}));
}

TEST_CASE("choose_qparams_u8 and per-tensor quantization keep zero exact", "[quant]") {
  ActivationQParams p = choose_qparams_u8(-1.f, 3.f);
  CHECK(p.scale == Approx(4.0 / 255));
  CHECK(p.zero_point == 64);
  Tensor x = from_vector(std::vector<double>{0.0, -1.0, 3.0, 10.0, -5.0}, {5}, {});
  Tensor d = dequantize_per_tensor(quantize_per_tensor(x, p), p);
  const auto v = d.to_double_vector();
  CHECK(v[0] == 0.0);
  CHECK(v[3] == Approx(3.0).margin(p.scale));  // clipped to the range
  CHECK(v[4] == Approx(-1.0).margin(p.scale));
  CHECK(choose_qparams_u8(0.f, 6.f).zero_point == 0);
  CHECK_THROWS_WITH(choose_qparams_u8(2.f, 1.f), Catch::Contains("invalid range"));
}

TEST_CASE("quantize_per_tensor equals quantize_u8 element by element (ties, NaN, huge values, tails)", "[quant]") {
  const ActivationQParams p = choose_qparams_u8(-1.f, 3.f);
  std::vector<double> v;
  for (int i = 0; i < 37; ++i) v.push_back(-1.3 + 0.137 * i);
  v[3] = 2.5 * p.scale;  // a tie
  v[5] = 1e30;
  v[6] = -1e30;
  v[9] = std::nan("");
  const Tensor q = quantize_per_tensor(from_vector(v, {int64_t(v.size())}, {.dtype = DType::f32}), p);
  const uint8_t* qp = q.data<uint8_t>();
  for (size_t i = 0; i < v.size(); ++i)
    if (qp[i] != quantize_u8(float(v[i]), 1.f / p.scale, p.zero_point)) FAIL_CHECK("element " << i);
  CHECK(qp[9] == 0);
}

TEST_CASE("observers: minmax, ema, percentile, and no batches is an error", "[quant]") {
  Observer mm({.kind = ObserverKind::minmax});
  CHECK_THROWS_WITH(mm.qparams(), Catch::Contains("no calibration batch"));
  mm.observe(from_vector(std::vector<double>{-1, 2}, {2}, {}));
  mm.observe(from_vector(std::vector<double>{0, 5}, {2}, {}));
  CHECK((mm.lo() == -1.f && mm.hi() == 5.f && mm.batches() == 2));
  Observer ema({.kind = ObserverKind::ema, .ema_constant = 0.5});
  ema.observe(from_vector(std::vector<double>{-1, 2}, {2}, {}));
  ema.observe(from_vector(std::vector<double>{0, 6}, {2}, {}));
  CHECK((ema.lo() == -0.5f && ema.hi() == 4.f));
  // 10000 values in [0, 1) and one outlier: the 99th percentile ignores it, minmax does not
  Tensor x = rand_tensor({10001}, 4, DType::f32, 0, 1);
  { NoGradGuard ng; fill_(x.as_strided({1}, {1}, 10000), 100.0); }
  Observer pc({.kind = ObserverKind::percentile, .percentile = 99.0});
  pc.observe(x);
  CHECK(pc.hi() < 1.f);
  CHECK(pc.hi() > 0.95f);
  CHECK(pc.lo() < 0.05f);
  CHECK(parse_observer_kind("ema") == ObserverKind::ema);
  CHECK_THROWS_WITH(parse_observer_kind("histogram"), Catch::Contains("known: minmax, ema, percentile, mse"));
  CHECK_THROWS_WITH(Observer().observe(from_vector(std::vector<double>{NAN}, {1}, {})), Catch::Contains("non-finite"));
}

// n standard normal values (f32).
Tensor randn(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = g.normal_at(uint64_t(i));
  return from_vector(v, {n}, {.dtype = DType::f32});
}

// The measured squared error of quantizing x with q.
double quant_mse(const Tensor& x, ActivationQParams q) {
  const auto a = x.to_vector<float>(), b = dequantize_per_tensor(quantize_per_tensor(x, q), q).to_vector<float>();
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e += double(a[i] - b[i]) * (a[i] - b[i]);
  return e / double(a.size());
}

TEST_CASE("mse observer: beats min-max on a distribution with an outlier, equals it without", "[quant]") {
  // 2^20 values ~ N(0, 1) over two batches, and one at 80: min-max spends its 255 steps on
  // [-5, 80]; clipping the outlier costs 75^2 / 2^20 = 0.005 and saves more in rounding error
  Tensor a = randn({1 << 19}, 7), b = randn({1 << 19}, 8);
  { NoGradGuard ng; fill_(b.as_strided({1}, {1}, 17), 80.0); }
  Observer mm({.kind = ObserverKind::minmax}), mse({.kind = ObserverKind::mse});
  for (Observer* o : {&mm, &mse}) o->observe(a), o->observe(b);
  CHECK(mse.lo() == mm.lo());  // the extremes seen are the same
  Tensor all = cat({a, b}, 0);
  const double e_mm = quant_mse(all, mm.qparams()), e_mse = quant_mse(all, mse.qparams());
  UNSCOPED_INFO("quantization MSE: minmax " << e_mm << ", mse " << e_mse << ", mse range scale " << mse.qparams().scale);
  CHECK(e_mse < 0.8 * e_mm);
  CHECK(mse.qparams().scale < 0.5f * mm.qparams().scale);  // the outlier was clipped
  // a uniform distribution has nothing worth clipping: mse keeps (nearly) the min-max range
  Observer mm2({.kind = ObserverKind::minmax}), mse2({.kind = ObserverKind::mse});
  Tensor u = rand_tensor({20000}, 9, DType::f32, -1, 3);
  mm2.observe(u), mse2.observe(u);
  CHECK(mse2.qparams().scale == Approx(mm2.qparams().scale).epsilon(0.02));
  CHECK(quant_mse(u, mse2.qparams()) <= 1.05 * quant_mse(u, mm2.qparams()));
  CHECK_THROWS_WITH(Observer({.kind = ObserverKind::mse}).qparams(), Catch::Contains("no calibration batch"));
}

TEST_CASE("fold_batch_norms: the folded MobileNetV2 equals the unfolded one in eval", "[quant]") {
  MobileNetV2 net(tiny_net());
  randomize_batch_norms(net, 5);
  net.eval();
  NoGradGuard ng;
  Tensor x = rand_tensor({2, 3, 32, 32}, 9, DType::f32);
  Tensor before = net(x);
  const int64_t folded = fold_batch_norms(net);
  CHECK(folded == 52);  // stem + 17 blocks (2 or 3 each) + last conv
  for (auto& [name, m] : net.named_modules()) CHECK(dynamic_cast<BatchNorm2d*>(m) == nullptr);
  Tensor after = net(x);
  INFO("max |difference| " << max_diff(before, after) << " of max |logit| " << max_abs(before.to_double_vector()));
  CHECK(max_diff(before, after) <= 1e-5 * std::max(1.0, max_abs(before.to_double_vector())));
}

TEST_CASE("Int8Conv2d and Int8Linear equal f32 math on the dequantized operands", "[quant]") {
  NoGradGuard ng;
  Generator g(3);
  Conv2d conv(13, 21, 1, {}, true, {.gen = &g});
  const ActivationQParams q = choose_qparams_u8(-0.5f, 2.f);
  auto qc = Int8Conv2d::from_float(conv, q);
  Tensor x = rand_tensor({3, 13, 5, 7}, 8, DType::f32, -0.7, 2.2);
  Tensor xq = dequantize_per_tensor(quantize_per_tensor(x, q), q);
  Tensor wq = dequantize_per_channel(qc->weight_int8, qc->weight_scale);
  Tensor ref = conv2d(cast(xq, DType::f64), cast(wq, DType::f64), cast(conv.bias, DType::f64));
  test::check_close((*qc)(x), ref, 1e-5, 1e-5);
  qc->fused_relu6 = true;
  test::check_close((*qc)(x), relu6(ref), 1e-5, 1e-5);
  Linear lin(19, 6, true, {.gen = &g});
  auto ql = Int8Linear::from_float(lin, q);
  Tensor xl = rand_tensor({2, 5, 19}, 10, DType::f32, -0.5, 2);
  Tensor xlq = dequantize_per_tensor(quantize_per_tensor(xl, q), q);
  Tensor ref_l = linear(cast(xlq, DType::f64), cast(dequantize_per_channel(ql->weight_int8, ql->weight_scale), DType::f64),
                        cast(lin.bias, DType::f64));
  test::check_close((*ql)(xl), ref_l, 1e-5, 1e-5);
  CHECK_THROWS_WITH(Int8Conv2d::from_float(Conv2d(4, 4, 3, {.padding = 1}), q), Catch::Contains("only 1x1"));
}

TEST_CASE("Int8DepthwiseConv2d equals f32 math on the dequantized operands", "[quant]") {
  NoGradGuard ng;
  Generator g(4);
  for (int64_t stride : {1, 2}) {
    INFO("stride " << stride);
    Conv2d conv(6, 6, 3, {.stride = stride, .padding = 1, .groups = 6}, true, {.gen = &g});
    const ActivationQParams q = choose_qparams_u8(-0.5f, 4.f);
    auto qc = Int8DepthwiseConv2d::from_float(conv, q);
    Tensor x = rand_tensor({2, 6, 9, 7}, 8, DType::f32, -0.7, 4.2);
    Tensor xq = dequantize_per_tensor(quantize_per_tensor(x, q), q);
    Tensor wq = dequantize_per_channel(qc->weight_int8, qc->weight_scale);
    Tensor ref = conv2d(cast(xq, DType::f64), cast(wq, DType::f64), cast(conv.bias, DType::f64), conv.params);
    test::check_close((*qc)(x), ref, 1e-5, 1e-5);
    qc->fused_relu6 = true;
    test::check_close((*qc)(x), relu6(ref), 1e-5, 1e-5);
    // u8 input already in the layer's quantization: the same result
    CHECK(max_diff((*qc)(quantize_per_tensor(x, q)), (*qc)(x)) == 0.0);
  }
  CHECK_THROWS_WITH(Int8DepthwiseConv2d::from_float(Conv2d(4, 8, 3, {.padding = 1, .groups = 4}), {}),
                    Catch::Contains("needs groups == in == out"));
  auto dw = Int8DepthwiseConv2d::from_float(Conv2d(4, 4, 3, {.padding = 1, .groups = 4}), {});
  CHECK_THROWS_WITH((*dw)(zeros({1, 4, 5, 5}, {.dtype = DType::i32})), Catch::Contains("expected an f32 or u8 input"));
}

TEST_CASE("linked int8 convs pass u8 and give the bits of the unlinked f32 chain", "[quant]") {
  // MobileNetV2's block: expand 1x1 + ReLU6 -> depthwise 3x3 stride 2 + ReLU6 -> project 1x1
  NoGradGuard ng;
  Generator g(5);
  const ActivationQParams qx = choose_qparams_u8(-1.f, 3.f), qe = choose_qparams_u8(0.f, 5.f),
                          qd = choose_qparams_u8(0.f, 6.f);
  auto expand = Int8Conv2d::from_float(Conv2d(5, 12, 1, {}, true, {.gen = &g}), qx);
  auto dw = Int8DepthwiseConv2d::from_float(Conv2d(12, 12, 3, {.stride = 2, .padding = 1, .groups = 12}, true, {.gen = &g}), qe);
  auto project = Int8Conv2d::from_float(Conv2d(12, 7, 1, {}, true, {.gen = &g}), qd);
  expand->fused_relu6 = dw->fused_relu6 = true;
  Tensor x = rand_tensor({3, 5, 9, 11}, 12, DType::f32, -1.0, 3.0);
  const Tensor unlinked = (*project)((*dw)((*expand)(x)));
  Sequential chain;
  chain.push_back(expand);
  chain.push_back(std::make_shared<Absorbed>("FusedReLU6"));
  chain.push_back(dw);
  chain.push_back(project);
  CHECK(link_int8_chains(chain) == 2);
  CHECK(expand->output_linked());
  CHECK(dw->output_linked());
  CHECK(!project->output_linked());
  CHECK((*expand)(x).dtype() == DType::u8);
  const Tensor linked = chain.forward(x);
  REQUIRE(linked.dtype() == DType::f32);
  CHECK(max_diff(linked, unlinked) == 0.0);
}

TEST_CASE("MobileNetV2 PTQ: close to the float model, fewer weight bytes, every observer", "[quant]") {
  for (ObserverKind kind : {ObserverKind::minmax, ObserverKind::ema, ObserverKind::percentile, ObserverKind::mse}) {
    INFO("observer " << observer_kind_name(kind));
    auto ref = float_net();
    const int64_t fp32_bytes = weight_bytes(*ref);
    auto net = quantized_net(kind);
    NoGradGuard ng;
    Tensor x = rand_tensor({4, 3, 32, 32}, 1, DType::f32);  // a calibration batch
    const Tensor a = (*ref)(x), b = (*net)(x);
    const double rel = max_diff(a, b) / max_abs(a.to_double_vector());
    INFO("relative max difference " << rel);
    CHECK(rel < 0.03);
    CHECK(rel > 0.0);  // it really is quantized
    const auto layers = quantized_layers(*net);
    CHECK(layers.at("features.0.0") == "Int8WeightOnlyConv2d");
    CHECK(layers.at("features.2.conv.0.0") == "Int8Conv2d");
    CHECK(layers.at("features.2.conv.1.0") == "Int8DepthwiseConv2d");
    CHECK(layers.at("classifier.1") == "Int8Linear");
    INFO("weight bytes fp32 " << fp32_bytes << " int8 " << weight_bytes(*net));
    CHECK(double(fp32_bytes) / double(weight_bytes(*net)) > 3.5);
  }
}

TEST_CASE("PTQ errors: convert without calibration, quantizing a quantized GPT", "[quant]") {
  MobileNetV2 net(tiny_net());
  net.eval();
  fold_batch_norms(net);
  CHECK_THROWS_WITH(convert_ptq(net), Catch::Contains("has no calibration probe"));
  prepare_ptq(net, {});
  CHECK_THROWS_WITH(convert_ptq(net), Catch::Contains("saw no calibration batch"));
  MobileNetV2 unfolded(tiny_net());
  CHECK_THROWS_WITH(prepare_ptq(unfolded, {}), Catch::Contains("call fold_batch_norms first"));
  GPT gpt(GPTConfig{.vocab_size = 64, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32});
  CHECK(quantize_gpt_weight_only(gpt) == 4);
  CHECK_THROWS_WITH(quantize_gpt_weight_only(gpt), Catch::Contains("already quantized"));
}

TEST_CASE("GPT weight-only int8: logits close to fp32, Linear bytes about 4x smaller", "[quant]") {
  GPTConfig cfg{.vocab_size = 64, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 64};
  GPT ref(cfg), q(cfg);
  q.load_state_dict(ref.state_dict());
  const int64_t before = weight_bytes(q);
  quantize_gpt_weight_only(q);
  const int64_t after = weight_bytes(q);
  // Linears: 4 * (C*3C + C*C + C*4C + 4C*C) = 12 C^2 per block (+ biases), to 1/4 (+ scales)
  const int64_t linear_params = 2 * 12 * 64 * 64;
  CHECK(before - after >= int64_t(0.74 * 3 * double(linear_params)));
  NoGradGuard ng;
  Tensor idx = from_vector(std::vector<double>{1, 5, 9, 33, 2, 60, 7, 7}, {1, 8}, {.dtype = DType::i64});
  const Tensor a = ref.forward(idx), b = q.forward(idx);
  const double rel = max_diff(a, b) / max_abs(a.to_double_vector());
  INFO("relative max difference " << rel);
  CHECK(rel < 0.02);
  CHECK(rel > 0.0);
}

TEST_CASE("quantized files: round trip bit-identical, corrupt files rejected with clear errors", "[quant]") {
  auto net = quantized_net();
  const std::string path = temp_path("net.safetensors");
  save_quantized(path, *net, {.model = "mobilenetv2", .config = net->config().to_json(), .scheme = "int8_ptq",
                              .calibration = {{"observer", "minmax"}, {"batches", 2}}, .layers = {}});
  CHECK(is_quantized_file(path));
  LoadedQuantizedModel loaded = load_quantized(path);
  NoGradGuard ng;
  Tensor x = rand_tensor({2, 3, 32, 32}, 77, DType::f32);
  auto* net2 = dynamic_cast<MobileNetV2*>(loaded.model.get());
  REQUIRE(net2 != nullptr);
  const Tensor a = (*net)(x), b = (*net2)(x);
  CHECK(a.to_double_vector() == b.to_double_vector());
  CHECK(loaded.info.calibration.at("batches") == 2);

  // the same tensors with one changed, written with the same metadata
  auto tensors = load_safetensors(path);
  const auto meta = load_safetensors_metadata(path);
  auto rewrite = [&](auto edit) {
    auto t2 = tensors;
    auto m2 = meta;
    edit(t2, m2);
    const std::string p = temp_path("bad.safetensors");
    save_safetensors(p, t2, m2);
    return p;
  };
  const std::string missing = rewrite([](auto& t, auto&) {
    std::erase_if(t, [](const auto& kv) { return kv.first == "features.2.conv.0.0.weight_scale"; });
  });
  CHECK_THROWS_WITH(load_quantized(missing), Catch::Contains("features.2.conv.0.0.weight_scale") && Catch::Contains("bad.safetensors"));
  const std::string shape = rewrite([](auto& t, auto&) {
    for (auto& [k, v] : t)
      if (k == "classifier.1.weight_scale") v = full({3}, 0.1);
  });
  CHECK_THROWS_WITH(load_quantized(shape), Catch::Contains("classifier.1.weight_scale"));
  const std::string neg = rewrite([](auto& t, auto&) {
    for (auto& [k, v] : t)
      if (k == "classifier.1.weight_scale") v = full(v.shape(), -1.0);
  });
  CHECK_THROWS_WITH(load_quantized(neg), Catch::Contains("not a positive finite scale"));
  const std::string zp = rewrite([](auto& t, auto&) {
    for (auto& [k, v] : t)
      if (k == "classifier.1.input_zero_point") v = full({1}, 300, {.dtype = DType::i32});
  });
  CHECK_THROWS_WITH(load_quantized(zp), Catch::Contains("zero point"));
  const std::string layers = rewrite([](auto&, auto& m) {
    auto j = nlohmann::json::parse(m.at(kQuantMetadataKey));
    j["layers"].erase("classifier.1");
    m[kQuantMetadataKey] = j.dump();
  });
  CHECK_THROWS_WITH(load_quantized(layers), Catch::Contains("no quantized layer 'classifier.1'"));
  const std::string nometa = rewrite([](auto&, auto& m) { m.erase(kQuantMetadataKey); });
  CHECK(!is_quantized_file(nometa));
  CHECK_THROWS_WITH(load_quantized(nometa), Catch::Contains("is not a memgrad quantized model"));
  // truncated: the safetensors reader names the file
  std::filesystem::resize_file(nometa, std::filesystem::file_size(nometa) / 2);
  CHECK_THROWS_WITH(load_quantized(nometa), Catch::Contains("bad.safetensors"));
  std::filesystem::remove(nometa);
  std::filesystem::remove(path);
}

TEST_CASE("quantized GPT file round trip", "[quant]") {
  GPTConfig cfg{.vocab_size = 64, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32};
  GPT gpt(cfg);
  quantize_gpt_weight_only(gpt);
  const std::string path = temp_path("gpt.safetensors");
  save_quantized(path, gpt, {.model = "gpt", .config = cfg.to_json(), .scheme = "int8_weight_only", .calibration = {}, .layers = {}});
  LoadedQuantizedModel l = load_quantized(path);
  auto* g2 = dynamic_cast<GPT*>(l.model.get());
  REQUIRE(g2 != nullptr);
  CHECK(l.info.layers.size() == 4);
  NoGradGuard ng;
  Tensor idx = from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4}, {.dtype = DType::i64});
  CHECK(gpt.forward(idx).to_double_vector() == g2->forward(idx).to_double_vector());
  std::filesystem::remove(path);
}
