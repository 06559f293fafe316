// Layers: PyTorch's default initialisation (bounds and moments), reproducibility from a seed,
// forward values against hand-computed results or the functional op, BatchNorm's running
// statistics and counter, Dropout's train/eval behaviour, Sequential/ModuleList naming, f64
// gradcheck through a small stack, meta shapes, bad-input messages and bf16 against f32.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/engine.h"
#include "models/nn/init.h"
#include "models/nn/layers.h"
#include "test_helpers.h"

using namespace mg;

namespace {

struct Moments {
  double mean = 0, var = 0, min = 1e30, max = -1e30;
};

Moments moments(const Tensor& t) {
  Moments m;
  auto v = t.to_double_vector();
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= double(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= double(v.size());
  return m;
}

}  // namespace

TEST_CASE("layers: Linear init is U(-1/sqrt(in), 1/sqrt(in)) and reproducible", "[layers]") {
  Generator g1(42), g2(42), g3(43);
  Linear a(256, 128, true, {.gen = &g1}), b(256, 128, true, {.gen = &g2}), c(256, 128, true, {.gen = &g3});
  CHECK(a.weight.shape() == Shape{128, 256});
  CHECK(a.bias.shape() == Shape{128});
  CHECK(a.weight.to_double_vector() == b.weight.to_double_vector());
  CHECK(a.weight.to_double_vector() != c.weight.to_double_vector());
  // Weight then bias, each at its own reserved stretch of the stream.
  CHECK(g1.offset() == 128 * 256 + 128);
  const double bound = 1.0 / 16.0;
  Moments w = moments(a.weight);
  CHECK(w.min >= -bound);
  CHECK(w.max < bound);
  CHECK(w.max > 0.99 * bound);
  CHECK(std::abs(w.mean) < 0.01 * bound);
  CHECK(w.var == Approx(bound * bound / 3).epsilon(0.02));  // variance of U(-b, b)
  Moments bm = moments(a.bias);
  CHECK(bm.min >= -bound);
  CHECK(bm.max < bound);
  Linear nb(3, 2, false);
  CHECK_FALSE(nb.bias.defined());
  CHECK(nb.named_parameters().size() == 1);
}

TEST_CASE("layers: Linear forward is x W^T + b", "[layers]") {
  Linear fc(3, 2, true, {.dtype = DType::f64});
  copy_(fc.weight, from_vector({1.0, 2.0, 3.0, -1.0, 0.5, 0.0}, {2, 3}, {.dtype = DType::f64}));
  copy_(fc.bias, from_vector({0.5, -0.25}, {2}, {.dtype = DType::f64}));
  Tensor x = from_vector({1.0, 0.0, -1.0, 2.0, 1.0, 1.0}, {2, 3}, {.dtype = DType::f64});
  // row 0: [1 - 3 + 0.5, -1 + 0 - 0.25] = [-1.5, -1.25]; row 1: [2 + 2 + 3 + 0.5, -2 + 0.5 - 0.25] = [7.5, -1.75]
  test::check_values(fc.forward(x), {-1.5, -1.25, 7.5, -1.75}, 1e-12, 1e-12);
  // Batch dims pass through: (2, 2, 3) -> (2, 2, 2).
  CHECK(fc(reshape(cat({x, x}, 0), {2, 2, 3})).shape() == Shape{2, 2, 2});
  CHECK_THROWS_WITH(fc.forward(zeros({2, 4}, {.dtype = DType::f64})),
                    Catch::Contains("Linear: expected input (..., 3), got (2, 4)"));
}

TEST_CASE("layers: Conv2d init uses fan_in = Cin/groups * K * K", "[layers]") {
  Generator gen(5);
  Conv2d conv(8, 16, 3, {.stride = 1, .padding = 1, .groups = 4}, true, {.gen = &gen});
  CHECK(conv.weight.shape() == Shape{16, 2, 3, 3});
  const double bound = 1.0 / std::sqrt(2.0 * 9.0);
  Moments w = moments(conv.weight);
  CHECK(w.min >= -bound);
  CHECK(w.max < bound);
  CHECK(w.max > 0.9 * bound);
  Moments b = moments(conv.bias);
  CHECK(b.max < bound);
  Tensor x = test::rand_tensor({2, 8, 5, 5}, 9, DType::f32);
  Tensor y = conv.forward(x);
  CHECK(y.shape() == Shape{2, 16, 5, 5});
  test::check_close(y, conv2d(x, conv.weight, conv.bias, conv.params), 0, 0);
  CHECK_THROWS_WITH(Conv2d(6, 16, 3, {.groups = 4}), Catch::Contains("groups 4 must divide in_channels 6"));
  CHECK_THROWS_WITH(conv.forward(zeros({2, 3, 5, 5})), Catch::Contains("Conv2d: expected input (N, 8, H, W)"));
  Conv2d strided(3, 4, 3, {.stride = 2}, false);
  CHECK_FALSE(strided.bias.defined());
  CHECK(strided.forward(zeros({1, 3, 7, 7})).shape() == Shape{1, 4, 3, 3});
}

TEST_CASE("layers: BatchNorm2d updates running statistics while training only", "[layers]") {
  BatchNorm2d bn(2, 1e-5, 0.1, {.dtype = DType::f64});
  CHECK(bn.weight.to_double_vector() == std::vector<double>{1, 1});
  CHECK(bn.running_var.to_double_vector() == std::vector<double>{1, 1});
  // (N=2, C=2, H=1, W=2): channel 0 holds {1, 2, 3, 4}, channel 1 holds {0, 0, 2, 2}.
  Tensor x = from_vector({1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 2.0, 2.0}, {2, 2, 1, 2}, {.dtype = DType::f64});
  Tensor y = bn.forward(x);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  // means 2.5 and 1; unbiased variances 5/3 and 4/3; new = 0.9 old + 0.1 batch.
  test::check_values(bn.running_mean, {0.25, 0.1}, 1e-12, 1e-12);
  test::check_values(bn.running_var, {0.9 + 0.1 * 5.0 / 3.0, 0.9 + 0.1 * 4.0 / 3.0}, 1e-12, 1e-12);
  // Channel 0 normalised with the biased batch variance 1.25.
  CHECK(y.to_double_vector()[0] == Approx((1.0 - 2.5) / std::sqrt(1.25 + 1e-5)));
  bn.eval();
  Tensor ye = bn.forward(x);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  test::check_values(bn.running_mean, {0.25, 0.1}, 1e-12, 1e-12);
  CHECK(ye.to_double_vector()[0] == Approx((1.0 - 0.25) / std::sqrt(0.9 + 0.1 * 5.0 / 3.0 + 1e-5)));
  CHECK_THROWS_WITH(bn.forward(zeros({2, 3, 2, 2}, {.dtype = DType::f64})),
                    Catch::Contains("BatchNorm2d: expected input (N, 2, H, W)"));
}

TEST_CASE("layers: LayerNorm and Embedding", "[layers]") {
  LayerNorm ln(4);
  CHECK(ln.weight.to_double_vector() == std::vector<double>(4, 1.0));
  CHECK(ln.bias.to_double_vector() == std::vector<double>(4, 0.0));
  Tensor x = from_vector({1.0, 2.0, 3.0, 4.0}, {1, 4});
  // mean 2.5, biased variance 1.25
  const double s = 1.0 / std::sqrt(1.25 + 1e-5);
  test::check_values(ln.forward(x), {-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s}, 1e-5, 1e-6);
  CHECK_THROWS_WITH(ln.forward(zeros({2, 3})), Catch::Contains("LayerNorm: expected input (..., 4)"));
  LayerNorm no_bias(4, 1e-5, false);
  CHECK_FALSE(no_bias.bias.defined());

  Generator gen(3);
  Embedding emb(1000, 64, 0.02, {.gen = &gen});
  Moments m = moments(emb.weight);
  CHECK(std::abs(m.mean) < 0.001);
  CHECK(std::sqrt(m.var) == Approx(0.02).epsilon(0.02));
  Tensor idx = from_vector({3.0, 0.0, 3.0}, {3}, {.dtype = DType::i64});
  Tensor rows = emb.forward(idx);
  CHECK(rows.shape() == Shape{3, 64});
  auto w = emb.weight.to_double_vector();
  auto r = rows.to_double_vector();
  CHECK(std::vector<double>(r.begin(), r.begin() + 64) == std::vector<double>(w.begin() + 3 * 64, w.begin() + 4 * 64));
  Embedding standard(10, 8);
  CHECK(std::sqrt(moments(standard.weight).var) > 0.5);  // N(0, 1) by default
}

TEST_CASE("layers: Dropout drops while training and is the identity in eval", "[layers]") {
  Generator gen(17);
  Dropout drop(0.25, &gen);
  Tensor x = ones({4000});
  Tensor y = drop.forward(x);
  int64_t zeros_n = 0;
  for (double v : y.to_double_vector()) {
    if (v == 0) ++zeros_n;
    else CHECK(v == Approx(1.0 / 0.75));
  }
  CHECK(double(zeros_n) / 4000 == Approx(0.25).margin(0.03));
  drop.eval();
  CHECK(drop.forward(x).to_double_vector() == x.to_double_vector());
  CHECK_THROWS_WITH(Dropout(1.0), Catch::Contains("p must be in [0, 1)"));
}

TEST_CASE("layers: activations match their ops", "[layers]") {
  Tensor x = from_vector({-7.0, -1.0, -0.5, 0.0, 0.5, 1.0, 7.0}, {7});
  test::check_values(ReLU().forward(x), {0, 0, 0, 0, 0.5, 1, 7});
  test::check_values(ReLU6().forward(x), {0, 0, 0, 0, 0.5, 1, 6});
  test::check_close(GELU().forward(x), gelu_tanh(x), 0, 0);
  // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715))
  CHECK(GELU().forward(x).to_double_vector()[5] == Approx(0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * 1.044715))));
  // silu(x) = x sigmoid(x)
  CHECK(SiLU().forward(x).to_double_vector()[5] == Approx(1.0 / (1.0 + std::exp(-1.0))));
}

TEST_CASE("layers: Sequential chains its layers under the names 0, 1, ...", "[layers]") {
  Generator gen(1);
  InitOptions init{.gen = &gen, .dtype = DType::f64};
  auto fc1 = std::make_shared<Linear>(3, 5, true, init);
  auto fc2 = std::make_shared<Linear>(5, 2, true, init);
  Sequential seq({fc1, std::make_shared<GELU>()});
  auto got = seq.push_back(fc2);
  CHECK(got == fc2);
  CHECK(seq.size() == 3);
  std::vector<std::string> names;
  for (auto& [n, _] : seq.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  Tensor x = test::rand_tensor({4, 3}, 2);
  test::check_close(seq.forward(x), fc2->forward(gelu_tanh(fc1->forward(x))), 0, 0);
  CHECK_THROWS_WITH(seq[3], Catch::Contains("index 3 out of range for 3 layers"));
  ModuleList list;
  CHECK_THROWS_WITH(list[0], Catch::Contains("index 0 out of range for 0 modules"));
}

TEST_CASE("layers: gradcheck through Linear, LayerNorm, GELU, Linear in f64", "[layers]") {
  Generator gen(4);
  InitOptions init{.gen = &gen, .dtype = DType::f64};
  Sequential net({std::make_shared<Linear>(3, 4, true, init), std::make_shared<LayerNorm>(4, 1e-5, true, init),
                  std::make_shared<GELU>(), std::make_shared<Linear>(4, 2, true, init)});
  auto params = net.parameters();
  std::vector<Tensor> inputs = {test::leaf(test::rand_tensor({5, 3}, 8))};
  for (auto& p : params) inputs.push_back(p);
  // The function sees the parameters through the module (gradcheck perturbs them in place).
  test::check_gradcheck([&](const std::vector<Tensor>& in) { return net.forward(in[0]); }, inputs);
  // A transposed (non-contiguous) input.
  Tensor xt = test::leaf(test::rand_tensor({3, 5}, 9));
  test::check_gradcheck([&](const std::vector<Tensor>& in) { return net.forward(transpose(in[0], 0, 1)); }, {xt});
}

TEST_CASE("layers: a model built on meta gives output shapes", "[layers]") {
  InitOptions init{.device = kMeta};
  Sequential net({std::make_shared<Conv2d>(3, 8, 3, Conv2dParams{.stride = 2, .padding = 1}, false, init),
                  std::make_shared<BatchNorm2d>(8, 1e-5, 0.1, init), std::make_shared<ReLU6>()});
  Tensor y = net.forward(empty({2, 3, 16, 16}, {.device = kMeta}));
  CHECK(y.shape() == Shape{2, 8, 8, 8});
  CHECK(y.is_meta());
}

TEST_CASE("layers: bf16 forward tracks f32 within bf16 precision", "[layers]") {
  Generator g1(21), g2(21);
  Sequential f32_net({std::make_shared<Linear>(16, 32, true, InitOptions{.gen = &g1}), std::make_shared<SiLU>(),
                      std::make_shared<Linear>(32, 8, true, InitOptions{.gen = &g1})});
  Sequential bf16_net({std::make_shared<Linear>(16, 32, true, InitOptions{.gen = &g2}), std::make_shared<SiLU>(),
                       std::make_shared<Linear>(32, 8, true, InitOptions{.gen = &g2})});
  bf16_net.to(DType::bf16);
  Tensor x = test::rand_tensor({4, 16}, 3, DType::f32);
  Tensor y32 = f32_net.forward(x);
  Tensor y16 = bf16_net.forward(cast(x, DType::bf16));
  CHECK(y16.dtype() == DType::bf16);
  test::check_close(cast(y16, DType::f32), y32, 3e-2, 2e-2);
}
