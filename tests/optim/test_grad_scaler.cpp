// GradScaler (optim/grad_scaler.h): scaling the loss, unscaling gradients once per step, skipping
// a step with inf/NaN gradients and backing the scale off, growth after growth_interval good
// steps, and the state's JSON round trip with checked fields.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "autograd/engine.h"
#include "ops/ops.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "test_helpers.h"

using namespace mg;

namespace {

// A leaf parameter with a given gradient.
Tensor param_with_grad(std::vector<double> w, std::vector<double> g) {
  Tensor p = from_vector(w, {int64_t(w.size())});
  p.set_requires_grad(true);
  p.set_grad(from_vector(g, {int64_t(g.size())}));
  return p;
}

}  // namespace

TEST_CASE("grad scaler: scale, unscale once, step") {
  Tensor p = param_with_grad({1.0, 2.0}, {0, 0});
  SGD opt(NamedTensors{{"p", p}}, 0.5);
  GradScaler scaler({.init_scale = 1024.0});
  Tensor loss = sum(mul(p, p));
  Tensor scaled = scaler.scale(loss);
  CHECK(scaled.item_double() == Approx(1024.0 * 5.0));
  p.set_grad(Tensor());
  backward(scaled);
  test::check_values(p.grad(), {2048.0, 4096.0});
  CHECK(scaler.unscale(opt));
  CHECK(scaler.unscale(opt));  // the second call in a step does nothing
  test::check_values(p.grad(), {2.0, 4.0});
  CHECK(scaler.step(opt));
  test::check_values(p, {0.0, 0.0});  // 1 - 0.5 * 2, 2 - 0.5 * 4
  CHECK(scaler.scale_value() == 1024.0);
  CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("grad scaler: inf or NaN skips the step and halves the scale, growth after the interval") {
  for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Tensor p = param_with_grad({1.0, 2.0}, {1.0, bad});
    Tensor q = param_with_grad({3.0}, {1.0});
    SGD opt(NamedTensors{{"p", p}, {"q", q}}, 0.1);
    GradScaler scaler({.init_scale = 8.0, .growth_interval = 3});
    CHECK_FALSE(scaler.step(opt));
    test::check_values(p, {1.0, 2.0});  // untouched
    test::check_values(q, {3.0});
    CHECK(scaler.scale_value() == 4.0);
    CHECK(scaler.skipped_steps() == 1);
    CHECK(opt.step_count() == 0);
    for (int i = 0; i < 3; ++i) {
      p.set_grad(from_vector({4.0, 4.0}, {2}));
      q.set_grad(from_vector({4.0}, {1}));
      CHECK(scaler.step(opt));
    }
    CHECK(scaler.scale_value() == 8.0);  // grew once after 3 good steps
    CHECK(scaler.growth_tracker() == 0);
    CHECK(opt.step_count() == 3);
  }
}

TEST_CASE("grad scaler: state round trip and checked loading") {
  Tensor p = param_with_grad({1.0}, {std::numeric_limits<double>::infinity()});
  SGD opt(NamedTensors{{"p", p}}, 0.1);
  GradScaler a({.init_scale = 64.0, .growth_interval = 7});
  a.step(opt);
  p.set_grad(from_vector({1.0}, {1}));
  a.step(opt);
  nlohmann::json j = a.state();
  GradScaler b;
  b.load_state(nlohmann::json::parse(j.dump()));
  CHECK(b.scale_value() == 32.0);
  CHECK(b.growth_tracker() == 1);
  CHECK(b.skipped_steps() == 1);
  CHECK(b.options().growth_interval == 7);
  CHECK(b.state() == j);
  nlohmann::json missing = j;
  missing.erase("scale");
  CHECK_THROWS_WITH(b.load_state(missing), Catch::Contains("'scale' is missing"));
  nlohmann::json bad = j;
  bad["scale"] = -1.0;
  CHECK_THROWS_WITH(b.load_state(bad), Catch::Contains("init_scale must be a positive"));
  CHECK(b.scale_value() == 32.0);  // a failed load changes nothing
}
