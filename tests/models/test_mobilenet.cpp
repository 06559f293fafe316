// MobileNetV2: channel rounding, named configurations and JSON, torchvision's parameter counts
// and names, torchvision's initialisation, meta shapes, forward in eval and train mode, loss,
// gradients and BatchNorm buffers against PyTorch (tests/gen_model_fixtures.py), bf16, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>

#include "autograd/engine.h"
#include "core/safetensors.h"
#include "models/mobilenet_v2.h"
#include "test_helpers.h"

using namespace mg;

namespace {

struct Fixture {
  std::map<std::string, Tensor> weights, data;
};

// mobilenet_tiny.safetensors: weights in f32 (cast to `dtype`), "fixture.*" entries apart.
Fixture load_fixture(DType dtype) {
  Fixture f;
  for (auto& [name, t] : load_safetensors(std::string(MG_FIXTURE_DIR) + "/mobilenet_tiny.safetensors")) {
    if (name.rfind("fixture.", 0) == 0) f.data[name.substr(8)] = t;
    else f.weights[name] = is_floating(t.dtype()) ? cast(t, dtype) : t;
  }
  return f;
}

MobileNetV2Config tiny_config(bool small_input) {
  return {.width_mult = 0.25, .num_classes = 10, .small_input = small_input, .dropout = 0.0};
}

double stddev(const Tensor& t) {
  auto v = t.to_double_vector();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

}  // namespace

TEST_CASE("mobilenet: make_divisible rounds as torchvision", "[mobilenet]") {
  CHECK(make_divisible(32) == 32);
  CHECK(make_divisible(32 * 0.25) == 8);
  CHECK(make_divisible(16 * 0.25) == 8);   // never below the divisor
  CHECK(make_divisible(24 * 0.75) == 24);  // 18 -> 16 would lose > 10%: 24
  CHECK(make_divisible(96 * 1.4) == 136);  // 134.4 -> 136
  CHECK(make_divisible(1280 * 1.0) == 1280);
}

TEST_CASE("mobilenet: named configurations and JSON", "[mobilenet]") {
  auto c32 = MobileNetV2Config::named("mobilenetv2-32");
  CHECK((c32.num_classes == 10 && c32.small_input && c32.input_size == 32 && c32.width_mult == 1.0));
  auto c224 = MobileNetV2Config::named("mobilenetv2-224");
  CHECK((c224.num_classes == 1000 && !c224.small_input && c224.input_size == 224 && c224.dropout == 0.2));
  CHECK_THROWS_WITH(MobileNetV2Config::named("mobilenetv3"),
                    Catch::Contains("unknown configuration 'mobilenetv3'") && Catch::Contains("mobilenetv2-32"));
  CHECK(MobileNetV2Config::from_json(c32.to_json()).to_json() == c32.to_json());
  CHECK(MobileNetV2Config::from_json(nlohmann::json{{"width_mult", 0.5}}).width_mult == 0.5);
  CHECK_THROWS_WITH(MobileNetV2Config::from_json(nlohmann::json{{"classes", 10}}), Catch::Contains("unknown key 'classes'"));
  CHECK_THROWS_WITH(MobileNetV2Config::from_json(nlohmann::json{{"small_input", 1}}),
                    Catch::Contains("'small_input' must be a boolean"));
  CHECK_THROWS_WITH(MobileNetV2Config::from_json(nlohmann::json{{"width_mult", -1.0}}),
                    Catch::Contains("width_mult must be positive"));
}

TEST_CASE("mobilenet: parameter counts, named conv/bn/act units and torchvision names", "[mobilenet]") {
  // torchvision.models.mobilenet_v2() has 3,504,872 parameters; with 10 classes the classifier
  // loses 1280 * 990 + 990 (tests/gen_model_fixtures.py prints both counts).
  MobileNetV2 m224(MobileNetV2Config::named("mobilenetv2-224"), {.device = kMeta});
  CHECK(m224.num_parameters() == 3504872);
  MobileNetV2 m32(MobileNetV2Config::named("mobilenetv2-32"), {.device = kMeta});
  CHECK(m32.num_parameters() == 2236682);
  CHECK(m224.features->size() == 19);
  std::map<std::string, Shape> shapes;
  for (auto& [n, t] : m224.state_dict()) shapes[n] = t.shape();
  CHECK(shapes.at("features.0.conv.weight") == Shape{32, 3, 3, 3});
  CHECK(shapes.at("features.1.conv.0.conv.weight") == Shape{32, 1, 3, 3});  // t = 1: no expansion
  CHECK(shapes.at("features.1.conv.1.weight") == Shape{16, 32, 1, 1});
  CHECK(shapes.at("features.2.conv.0.conv.weight") == Shape{96, 16, 1, 1});
  CHECK(shapes.at("features.2.conv.1.conv.weight") == Shape{96, 1, 3, 3});
  CHECK(shapes.at("features.2.conv.1.bn.weight") == Shape{96});
  CHECK(shapes.at("features.2.conv.3.running_var") == Shape{24});
  CHECK(shapes.at("features.17.conv.2.weight") == Shape{320, 960, 1, 1});
  CHECK(shapes.at("features.18.conv.weight") == Shape{1280, 320, 1, 1});
  CHECK(shapes.at("features.18.bn.num_batches_tracked") == Shape{});
  CHECK(shapes.at("classifier.1.weight") == Shape{1000, 1280});
  // torchvision's names: a conv-BN-ReLU6 unit's parts are "0" and "1" there.
  CHECK(MobileNetV2::torchvision_name("features.0.conv.weight") == "features.0.0.weight");
  CHECK(MobileNetV2::torchvision_name("features.2.conv.1.conv.weight") == "features.2.conv.1.0.weight");
  CHECK(MobileNetV2::torchvision_name("features.2.conv.1.bn.running_var") == "features.2.conv.1.1.running_var");
  CHECK(MobileNetV2::torchvision_name("features.2.conv.2.weight") == "features.2.conv.2.weight");
  CHECK(MobileNetV2::torchvision_name("features.18.bn.bias") == "features.18.1.bias");
  CHECK(MobileNetV2::torchvision_name("classifier.1.weight") == "classifier.1.weight");
  // The fixture (written from the PyTorch model) has exactly torchvision's names, one per entry.
  MobileNetV2 tiny(tiny_config(true), {.device = kMeta});
  Fixture f = load_fixture(DType::f32);
  CHECK(f.weights.size() == tiny.state_dict().size());
  std::set<std::string> tv;
  for (auto& [n, t] : tiny.state_dict()) tv.insert(MobileNetV2::torchvision_name(n));
  for (auto& [n, t] : f.weights) CHECK(tv.count(n) == 1);
  LoadResult r = tiny.load_torchvision_state_dict(NamedTensors(f.weights.begin(), f.weights.end()));
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  // A residual only where shapes agree (stride 1, in == out).
  CHECK_FALSE(std::dynamic_pointer_cast<InvertedResidual>((*m224.features)[2])->use_residual);
  CHECK(std::dynamic_pointer_cast<InvertedResidual>((*m224.features)[3])->use_residual);
}

TEST_CASE("mobilenet: torchvision initialisation", "[mobilenet]") {
  Generator g1(9), g2(9), gm(9);
  MobileNetV2 a(tiny_config(false), {.gen = &g1}), b(tiny_config(false), {.gen = &g2});
  MobileNetV2 m(tiny_config(false), {.gen = &gm, .device = kMeta});
  CHECK(g1.offset() == gm.offset());
  auto sd = a.state_dict();
  std::map<std::string, Tensor> byname(sd.begin(), sd.end());
  CHECK(a.state_dict()[0].second.to_double_vector() == b.state_dict()[0].second.to_double_vector());
  // kaiming normal, fan_out = Cout * K * K: the last 1x1 conv (1280, 80) has std sqrt(2 / 1280).
  CHECK(stddev(byname.at("features.18.conv.weight")) == Approx(std::sqrt(2.0 / 1280)).epsilon(0.05));
  // The depthwise conv of block 2 (48, 1, 3, 3): fan_out = 48 * 9 (groups do not enter).
  CHECK(stddev(byname.at("features.2.conv.1.conv.weight")) == Approx(std::sqrt(2.0 / (48 * 9))).epsilon(0.15));
  CHECK(stddev(byname.at("classifier.1.weight")) == Approx(0.01).epsilon(0.05));
  for (double v : byname.at("classifier.1.bias").to_double_vector()) REQUIRE(v == 0.0);
  for (double v : byname.at("features.5.conv.3.weight").to_double_vector()) REQUIRE(v == 1.0);
}

TEST_CASE("mobilenet: meta forward gives the logits shape", "[mobilenet]") {
  MobileNetV2 m224(MobileNetV2Config::named("mobilenetv2-224"), {.device = kMeta});
  Tensor y = m224.forward(empty({2, 3, 224, 224}, {.device = kMeta}));
  CHECK(y.shape() == Shape{2, 1000});
  CHECK(y.is_meta());
  MobileNetV2 m32(MobileNetV2Config::named("mobilenetv2-32"), {.device = kMeta});
  Tensor loss = cross_entropy(m32.forward(empty({4, 3, 32, 32}, {.device = kMeta})),
                              empty({4}, {.dtype = DType::i64, .device = kMeta}));
  backward(loss);
  CHECK(m32.classifier->operator[](1)->named_parameters()[0].second.grad().shape() == Shape{10, 1280});
}

TEST_CASE("mobilenet: eval and train forward, loss, gradients and buffers match PyTorch (f64)", "[mobilenet]") {
  Fixture f = load_fixture(DType::f64);
  for (const auto& [name, small] : {std::pair<std::string, bool>{"small", true}, {"std", false}}) {
    INFO(name);
    const std::string pre = name + ".";
    MobileNetV2 model(tiny_config(small), {.dtype = DType::f64});
    model.load_torchvision_state_dict(NamedTensors(f.weights.begin(), f.weights.end()));
    Tensor x = f.data.at(pre + "x"), targets = f.data.at(pre + "targets");
    model.eval();
    test::check_close(model.forward(x), f.data.at(pre + "eval_logits"), 1e-9, 1e-12);
    model.train();
    Tensor logits = model.forward(x);
    test::check_close(logits, f.data.at(pre + "logits"), 1e-9, 1e-12);
    Tensor loss = cross_entropy(logits, targets);
    test::check_close(loss, f.data.at(pre + "loss"), 1e-9, 1e-12);
    backward(loss);
    std::map<std::string, Tensor> params, state;
    for (auto& [n, p] : model.named_parameters()) params[MobileNetV2::torchvision_name(n)] = p;
    for (auto& [n, t] : model.state_dict()) state[MobileNetV2::torchvision_name(n)] = t;
    int checked = 0;
    for (const auto& [key, expected] : f.data) {
      if (key.rfind(pre + "grad.", 0) == 0) {
        INFO(key);
        // 1e-8: the stem's weight gradient sums over 17 blocks' worth of cancelling terms; clang's
        // narrower FMA contraction (-ffp-contract=on) lands 1.2e-9 (relative) from PyTorch there.
        test::check_close(params.at(key.substr(pre.size() + 5)).grad(), expected, 1e-8, 1e-12);
        ++checked;
      } else if (key.rfind(pre + "features.", 0) == 0) {
        INFO(key);
        test::check_close(state.at(key.substr(pre.size())), expected, 1e-9, 1e-12);
        ++checked;
      }
    }
    CHECK(checked == 8 + 9);
  }
}

TEST_CASE("mobilenet: bf16 forward tracks f32", "[mobilenet]") {
  Fixture f = load_fixture(DType::f32);
  MobileNetV2 model(tiny_config(true));
  model.load_torchvision_state_dict(NamedTensors(f.weights.begin(), f.weights.end()));
  model.eval();
  Tensor x = cast(f.data.at("small.x"), DType::f32);
  Tensor ref = model.forward(x);
  test::check_close(ref, f.data.at("small.eval_logits"), 1e-4, 1e-5);
  model.to(DType::bf16);
  Tensor y = model.forward(cast(x, DType::bf16));
  CHECK(y.dtype() == DType::bf16);
  test::check_close(cast(y, DType::f32), ref, 0.1, 0.1);
}

TEST_CASE("mobilenet: bad inputs name the problem", "[mobilenet]") {
  MobileNetV2 model(tiny_config(true), {.device = kMeta});
  CHECK_THROWS_WITH(model.forward(empty({2, 1, 16, 16}, {.device = kMeta})),
                    Catch::Contains("MobileNetV2: expected input (N, 3, H, W), got (2, 1, 16, 16)"));
  CHECK_THROWS_WITH(model.forward(empty({3, 16, 16}, {.device = kMeta})), Catch::Contains("got (3, 16, 16)"));
  MobileNetV2 cpu(tiny_config(true));
  CHECK_THROWS_WITH(cpu.forward(zeros({1, 3, 8, 8}, {.device = Device("cpu:1")})), Catch::Contains("cpu:1"));
  CHECK_THROWS_WITH(MobileNetV2(MobileNetV2Config{.num_classes = 0}), Catch::Contains("num_classes"));
}
