// Learned-scale fake quantization (ops/fake_quantize_learned.h) against PyTorch 1.13's
// _fake_quantize_learnable_per_{tensor,channel}_affine (tests/gen_quant_fixtures.py): the forward
// and the input's straight-through gradient bit for bit, the scale's LSQ gradient to float
// summation order, on cases clamped on both sides. Also: the forward is the fixed-scale op's, a
// scale that needs no gradient gets none, meta allocates only, and bad scales are clear errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "autograd/engine.h"
#include "core/safetensors.h"
#include "ops/fake_quantize.h"
#include "ops/fake_quantize_learned.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;

namespace {

using Case = std::map<std::string, Tensor>;

std::map<std::string, Case> load_cases() {
  std::map<std::string, Case> cases;
  for (auto& [name, t] : load_safetensors(std::string(MG_FIXTURE_DIR) + "/fake_quantize_learned.safetensors")) {
    const auto dot = name.find('.');
    cases[name.substr(0, dot)][name.substr(dot + 1)] = t;
  }
  return cases;
}

// How many elements of x fall below and above the grid [qmin, qmax] (scale per channel of x's dim 0).
std::pair<int, int> clamped(const Tensor& x, const Tensor& scale, float zero, float qmin, float qmax) {
  const auto xv = x.to_vector<float>(), sv = scale.to_vector<float>();
  const size_t inner = xv.size() / sv.size();
  int below = 0, above = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const float r = std::nearbyint(xv[i] / sv[i / inner]) + zero;
    below += r < qmin;
    above += r > qmax;
  }
  return {below, above};
}

}  // namespace

TEST_CASE("learned fake quantization matches PyTorch: forward, dx and the LSQ scale gradient", "[quant][ops][qat]") {
  const auto cases = load_cases();
  REQUIRE(cases.size() == 4);
  for (auto [name, c] : cases) {
    INFO("case " << name);
    const bool per_tensor = c.count("zero_point") > 0;
    const int32_t zero = per_tensor ? int32_t(c["zero_point"].item<int64_t>()) : 0;
    const double grad_factor = c["grad_factor"].item<double>();
    const auto [below, above] = per_tensor ? clamped(c["x"], c["scale"], float(zero), 0, 255)
                                           : clamped(c["x"], c["scale"], 0, -127, 127);
    CHECK((below > 0 && above > 0));  // both clamped branches of the gradient are exercised
    Tensor x = test::leaf(c["x"].detach()), s = test::leaf(c["scale"].detach());
    Tensor out = per_tensor ? fake_quantize_learned_per_tensor(x, s, zero, grad_factor)
                            : fake_quantize_learned_per_channel(x, s, grad_factor);
    CHECK(out.to_vector<float>() == c["out"].to_vector<float>());
    backward(out, c["gout"]);
    CHECK(x.grad().to_vector<float>() == c["dx"].to_vector<float>());
    // PyTorch sums f32 terms, memgrad f64 ones: the sums agree to float rounding of the terms
    test::check_close(s.grad(), c["dscale"], 1e-5, 1e-6);
  }
}

TEST_CASE("learned fake quantization: the fixed-scale forward, gradients on request, meta", "[quant][ops][qat]") {
  Tensor w = rand_tensor({4, 2, 3, 3}, 41, DType::f32, -0.6, 0.8);
  Tensor s = mul(per_channel_scales(w), 0.7);
  CHECK(fake_quantize_learned_per_channel(w, s, 0.1).to_vector<float>() ==
        fake_quantize_per_channel(w, s).to_vector<float>());
  Tensor x = rand_tensor({3, 10}, 42, DType::f32, -2, 3);
  const ActivationQParams q = choose_qparams_u8(-1.f, 2.f);
  Tensor sx = full({1}, q.scale, {.dtype = DType::f32});
  CHECK(fake_quantize_learned_per_tensor(x, sx, q.zero_point, 0.1).to_vector<float>() ==
        fake_quantize_per_tensor(x, q).to_vector<float>());
  CHECK(fake_quantize_learned_per_tensor(x, sx, q.zero_point, 0.1).grad_fn() == nullptr);  // nothing needs a gradient

  // only the scale learns (an input that needs no gradient, as the network's images)
  Tensor sl = test::leaf(sx.detach());
  backward(sum(fake_quantize_learned_per_tensor(x, sl, q.zero_point, 0.5)));
  REQUIRE(sl.grad().defined());
  CHECK(std::isfinite(sl.grad().item<float>()));
  CHECK(sl.grad().item<float>() != 0.f);
  // a bf16 input: output and input gradient come back in bf16
  Tensor xb = test::leaf(cast(x, DType::bf16).detach());
  Tensor yb = fake_quantize_learned_per_tensor(xb, sx, q.zero_point, 0.1);
  CHECK(yb.dtype() == DType::bf16);
  backward(sum(yb));
  CHECK(xb.grad().dtype() == DType::bf16);

  Tensor m = test::leaf(empty({3, 8}, {.dtype = DType::f32, .device = kMeta}));
  Tensor ms = test::leaf(empty({3}, {.dtype = DType::f32, .device = kMeta}));
  Tensor y = fake_quantize_learned_per_channel(m, ms, 0.1);
  CHECK((y.is_meta() && y.shape() == Shape{3, 8}));
  backward(sum(y));
  CHECK((m.grad().is_meta() && ms.grad().shape() == Shape{3}));
}

TEST_CASE("learned fake quantization: bad scales, zero points and grad factors are errors", "[quant][ops][qat]") {
  Tensor x = rand_tensor({3, 8}, 51, DType::f32, -2, 2);
  Tensor s1 = full({1}, 0.02, {.dtype = DType::f32});
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, full({1}, 0.0, {.dtype = DType::f32}), 10, 0.1),
                    Catch::Contains("fake_quantize_learned_per_tensor: scale 0 is 0 (must be positive and finite)"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, full({1}, -0.5, {.dtype = DType::f32}), 10, 0.1),
                    Catch::Contains("scale 0 is -0.5"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, full({1}, NAN, {.dtype = DType::f32}), 10, 0.1),
                    Catch::Contains("must be positive and finite"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, full({2}, 0.1, {.dtype = DType::f32}), 10, 0.1),
                    Catch::Contains("scale must be f32 (1), got f32 (2,)"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, full({1}, 0.1, {.dtype = DType::f64}), 10, 0.1),
                    Catch::Contains("scale must be f32 (1), got f64"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, Tensor(), 10, 0.1), Catch::Contains("an undefined tensor"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, s1, 256, 0.1), Catch::Contains("zero point 256 is outside [0, 255]"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(x, s1, 10, 0.0), Catch::Contains("grad_factor must be positive"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_tensor(full({2}, 1, {.dtype = DType::i32}), s1, 10, 0.1),
                    Catch::Contains("floating"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_channel(x, full({4}, 0.1, {.dtype = DType::f32}), 0.1),
                    Catch::Contains("fake_quantize_learned_per_channel: scale must be f32 (3), got f32 (4,)"));
  CHECK_THROWS_WITH(fake_quantize_learned_per_channel(x, full({3, 1}, 0.1, {.dtype = DType::f32}), 0.1),
                    Catch::Contains("scale must be f32 (3), got f32 (3, 1)"));
  Tensor bad = from_vector(std::vector<double>{0.1, -0.2, 0.1}, {3}, {.dtype = DType::f32});
  CHECK_THROWS_WITH(fake_quantize_learned_per_channel(x, bad, 0.1), Catch::Contains("scale 1 is -0.2"));
}
