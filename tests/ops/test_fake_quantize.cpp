// Fake quantization (ops/fake_quantize.h): the forward is bit-identical to quantize ->
// dequantize, the straight-through gradient passes inside the range and is zero where the value
// was clamped (checked element by element), other dtypes round-trip, meta allocates only, and bad
// inputs are errors naming the op.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/engine.h"
#include "ops/fake_quantize.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;

TEST_CASE("fake_quantize_per_channel: forward is quantize -> dequantize, STE gradient", "[quant][ops]") {
  Tensor w = rand_tensor({6, 3, 3, 3}, 11, DType::f32, -0.7, 0.9);
  const QuantizedChannels q = quantize_per_channel(w);
  CHECK(fake_quantize_per_channel(w, per_channel_scales(w)).to_vector<float>() ==
        dequantize_per_channel(q.values, q.scales).to_vector<float>());
  CHECK(per_channel_scales(w).to_vector<float>() == q.scales.to_vector<float>());

  // scales at half the max: the large values are clamped and get no gradient
  Tensor s = mul(per_channel_scales(w), 0.5);
  Tensor x = w.detach();
  x.set_requires_grad(true);
  Tensor dout = rand_tensor({6, 3, 3, 3}, 12, DType::f32, -1, 1);
  Tensor y = fake_quantize_per_channel(x, s);
  backward(sum(mul(y, dout)));
  const auto xv = x.to_vector<float>(), gv = dout.to_vector<float>(), dx = x.grad().to_vector<float>();
  const auto sv = s.to_vector<float>();
  int passed = 0, clamped = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const float r = std::nearbyint(xv[i] / sv[i / 27]);
    const bool inside = r >= -127 && r <= 127;
    CHECK(dx[i] == (inside ? gv[i] : 0.f));
    (inside ? passed : clamped)++;
  }
  CHECK((passed > 0 && clamped > 0));  // both branches were exercised
}

TEST_CASE("fake_quantize_per_tensor: forward is quantize -> dequantize, STE gradient", "[quant][ops]") {
  Tensor x = rand_tensor({4, 5, 7}, 21, DType::f32, -3, 5);
  const ActivationQParams q = choose_qparams_u8(-1.f, 2.5f);  // [-3, 5] overflows on both sides
  CHECK(fake_quantize_per_tensor(x, q).to_vector<float>() ==
        dequantize_per_tensor(quantize_per_tensor(x, q), q).to_vector<float>());

  Tensor xg = x.detach();
  xg.set_requires_grad(true);
  Tensor dout = rand_tensor({4, 5, 7}, 22, DType::f32, -1, 1);
  backward(sum(mul(fake_quantize_per_tensor(xg, q), dout)));
  const auto xv = x.to_vector<float>(), gv = dout.to_vector<float>(), dx = xg.grad().to_vector<float>();
  int passed = 0, below = 0, above = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const float r = std::nearbyint(xv[i] * (1.f / q.scale)) + float(q.zero_point);
    const bool inside = r >= 0 && r <= 255;
    CHECK(dx[i] == (inside ? gv[i] : 0.f));
    inside ? ++passed : (r < 0 ? ++below : ++above);
  }
  CHECK((passed > 0 && below > 0 && above > 0));

  // a value inside the range gets exactly the gradient of the identity
  Tensor one = full({1}, 0.3, {.dtype = DType::f32});
  one.set_requires_grad(true);
  backward(sum(fake_quantize_per_tensor(one, q)));
  CHECK(one.grad().item<float>() == 1.f);
}

TEST_CASE("fake quantization: other dtypes, meta, no grad, bad inputs", "[quant][ops]") {
  Tensor x = rand_tensor({3, 8}, 31, DType::f32, -2, 2);
  Tensor xb = cast(x, DType::bf16);
  const ActivationQParams q = choose_qparams_u8(-2.f, 2.f);
  Tensor yb = fake_quantize_per_tensor(xb, q);
  CHECK(yb.dtype() == DType::bf16);
  CHECK(yb.to_vector<float>() == cast(fake_quantize_per_tensor(cast(xb, DType::f32), q), DType::bf16).to_vector<float>());
  Tensor m = empty({3, 8}, {.dtype = DType::f32, .device = kMeta});
  CHECK(fake_quantize_per_tensor(m, q).shape() == Shape{3, 8});
  CHECK(fake_quantize_per_channel(m, empty({3}, {.dtype = DType::f32, .device = kMeta})).is_meta());
  CHECK(fake_quantize_per_tensor(x, q).grad_fn() == nullptr);  // no input needs a gradient: no node, no mask

  CHECK_THROWS_WITH(fake_quantize_per_tensor(full({2}, 1, {.dtype = DType::i32}), q),
                    Catch::Contains("fake_quantize_per_tensor") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(fake_quantize_per_tensor(x, {.scale = 0.f, .zero_point = 3}), Catch::Contains("scale must be positive"));
  CHECK_THROWS_WITH(fake_quantize_per_tensor(x, {.scale = 0.1f, .zero_point = 300}), Catch::Contains("zero point"));
  CHECK_THROWS_WITH(fake_quantize_per_channel(x, full({4}, 0.1)), Catch::Contains("scales must be f32 (3)"));
  CHECK_THROWS_WITH(fake_quantize_per_channel(x, full({3}, -0.1)), Catch::Contains("scale 0 is -0.1"));
  CHECK_THROWS_WITH(fake_quantize_per_channel(x, Tensor()), Catch::Contains("undefined"));
}
