// Autocast (autograd/autocast.h, ops/autocast_policy.h): the state and its guard; which ops run
// in the low type and which stay in f32; f64 left alone; promotion where a low branch meets f32;
// f32 parameters get f32 gradients close to an fp32 run's; backward runs with autocast off.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using mg::test::leaf;
using mg::test::rand_tensor;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = cast(a, DType::f64).to_double_vector(), y = cast(b, DType::f64).to_double_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}
double max_abs(const Tensor& a) {
  double m = 0;
  for (double v : cast(a, DType::f64).to_double_vector()) m = std::max(m, std::abs(v));
  return m;
}

}  // namespace

TEST_CASE("autocast: state, guard and nesting") {
  CHECK_FALSE(autocast_state().enabled);
  {
    AutocastGuard amp(DType::f16);
    CHECK(autocast_state().enabled);
    CHECK(autocast_state().dtype == DType::f16);
    {
      AutocastGuard off(DType::bf16, false);
      CHECK_FALSE(autocast_state().enabled);
    }
    CHECK(autocast_state().dtype == DType::f16);
    CHECK(autocast_state().enabled);
  }
  CHECK_FALSE(autocast_state().enabled);
  CHECK_THROWS_WITH(AutocastGuard(DType::f32), Catch::Contains("must be f16 or bf16"));
  CHECK_FALSE(autocast_state().enabled);  // a failed guard changes nothing
}

TEST_CASE("autocast: GEMM ops run in the low type, softmax, layer norm, losses and reductions in f32") {
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    Tensor x = rand_tensor({2, 3, 8}, 1, DType::f32), w = rand_tensor({5, 8}, 2, DType::f32);
    Tensor b = rand_tensor({5}, 3, DType::f32);
    Tensor img = rand_tensor({1, 2, 5, 5}, 4, DType::f32), cw = rand_tensor({3, 2, 3, 3}, 5, DType::f32);
    Tensor q = rand_tensor({1, 2, 4, 8}, 6, DType::f32);
    Tensor target = from_vector({0, 4, 1, 2, 3, 0}, {6}, {.dtype = DType::i64});
    AutocastGuard amp(low);
    CHECK(linear(x, w, b).dtype() == low);
    CHECK(matmul(x, transpose(w, 0, 1)).dtype() == low);
    CHECK(conv2d(img, cw).dtype() == low);
    CHECK(scaled_dot_product_attention(q, q, q).dtype() == low);
    Tensor y = linear(x, w, b);  // low
    CHECK(softmax(y, -1).dtype() == DType::f32);
    CHECK(log_softmax(y, -1).dtype() == DType::f32);
    CHECK(layer_norm(y, Tensor(), Tensor()).dtype() == DType::f32);
    CHECK(cross_entropy(reshape(y, {6, 5}), target).dtype() == DType::f32);
    CHECK(mse_loss(y, y).dtype() == DType::f32);
    CHECK(sum(y).dtype() == DType::f32);
    CHECK(mean(y, {1}).dtype() == DType::f32);
    // batch_norm keeps a 16-bit input's dtype (it computes in f32 inside) and takes f32 affine
    // parameters as they are: no cast on either side of a conv -> batch_norm -> relu6 chain.
    Tensor conv_out = conv2d(img, cw);
    Tensor bn_w = leaf(ones({3})), bn_b = leaf(zeros({3}));
    Tensor bn = batch_norm(conv_out, Tensor(), Tensor(), bn_w, bn_b, true);
    CHECK(bn.dtype() == low);
    CHECK(bn.grad_fn()->name() == "BatchNormBackward");  // not a cast
    backward(sum(bn));
    CHECK(bn_w.grad().dtype() == DType::f32);
    CHECK(batch_norm(img, Tensor(), Tensor(), Tensor(), Tensor(), true).dtype() == DType::f32);
    // Element-wise ops keep their input's type; a low branch meeting f32 is promoted to f32.
    CHECK(gelu_tanh(y).dtype() == low);
    CHECK(add(y, cast(y, DType::f32)).dtype() == DType::f32);
    CHECK(mul(cast(y, DType::f32), y).dtype() == DType::f32);
    // f64 is never lowered.
    Tensor xd = rand_tensor({3, 4}, 7), wd = rand_tensor({2, 4}, 8);
    CHECK(linear(xd, wd).dtype() == DType::f64);
  }
  // Outside autocast a dtype mix stays an error, and nothing is cast.
  Tensor a = rand_tensor({3}, 9, DType::f32);
  CHECK_THROWS_WITH(add(a, cast(a, DType::bf16)), Catch::Contains("dtypes differ"));
  CHECK(linear(rand_tensor({2, 4}, 10, DType::f32), rand_tensor({3, 4}, 11, DType::f32)).dtype() == DType::f32);
}

TEST_CASE("autocast: f32 parameters get f32 gradients close to fp32's, backward runs without autocast") {
  // A small MLP with a layer norm and a cross-entropy loss: the same parameters, once in fp32 and
  // once under autocast; the gradients must be f32 and agree within the 16-bit rounding.
  auto run = [](std::optional<DType> low, std::vector<Tensor>& grads) {
    Tensor x = rand_tensor({16, 32}, 21, DType::f32);
    Tensor w1 = leaf(mul(rand_tensor({64, 32}, 22, DType::f32), 0.3)), b1 = leaf(rand_tensor({64}, 23, DType::f32));
    Tensor w2 = leaf(mul(rand_tensor({10, 64}, 24, DType::f32), 0.3)), b2 = leaf(rand_tensor({10}, 25, DType::f32));
    Tensor target = from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16}, {.dtype = DType::i64});
    Tensor loss;
    {
      std::optional<AutocastGuard> amp;
      if (low) amp.emplace(*low);
      Tensor h = gelu_tanh(linear(x, w1, b1));
      h = layer_norm(h, Tensor(), Tensor());
      loss = cross_entropy(linear(h, w2, b2), target);
      CHECK(loss.dtype() == DType::f32);
      backward(loss);  // inside the guard on purpose: the engine turns autocast off
    }
    grads = {w1.grad(), b1.grad(), w2.grad(), b2.grad()};
    return loss.item_double();
  };
  std::vector<Tensor> ref, got;
  const double l32 = run(std::nullopt, ref);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    const double l = run(low, got);
    CHECK(std::abs(l - l32) < (low == DType::bf16 ? 2e-2 : 3e-3));
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO("gradient " << i);
      REQUIRE(got[i].defined());
      CHECK(got[i].dtype() == DType::f32);
      // bf16 has 8 mantissa bits (relative rounding 2^-9), f16 11 bits: errors relative to the
      // largest gradient entry, with the product's accumulation in f32.
      CHECK(max_abs_diff(got[i], ref[i]) <= (low == DType::bf16 ? 3e-2 : 4e-3) * max_abs(ref[i]));
    }
  }
}
