// Precise BatchNorm statistics: after recompute_batch_norm_stats the running mean is the plain
// average of the batches' means (and the variance of their unbiased variances), whatever the
// running statistics were before; momentum, the counter and the train/eval flag are left alone.
#include <catch2/catch.hpp>

#include "models/nn/batch_norm_stats.h"
#include "models/nn/nn.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;

TEST_CASE("recompute_batch_norm_stats averages the batches' statistics under the current weights", "[nn]") {
  Generator gen(3);
  Sequential net({std::make_shared<BatchNorm2d>(2, 1e-5, 0.1, InitOptions{.gen = &gen})});
  auto* bn = dynamic_cast<BatchNorm2d*>(net.children()[0].second.get());
  REQUIRE(bn != nullptr);
  std::vector<Tensor> batches;
  for (uint64_t k = 0; k < 3; ++k) batches.push_back(add(test::rand_tensor({4, 2, 3, 3}, 10 + k, DType::f32), double(k)));
  copy_(bn->running_mean, full({2}, 100.0));  // stale statistics, far from the data
  copy_(bn->running_var, full({2}, 50.0));
  net.eval();
  const int64_t counter = bn->num_batches_tracked.item<int64_t>();
  CHECK(recompute_batch_norm_stats(net, 3, [&](int64_t k) { net.forward(batches[size_t(k)]); }) == 1);
  CHECK_FALSE(net.is_training());
  CHECK(bn->momentum == 0.1);
  CHECK(bn->num_batches_tracked.item<int64_t>() == counter);
  for (int64_t c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (const Tensor& b : batches) {
      std::vector<double> v = contiguous(select(b, 1, c)).to_double_vector();
      double m = 0, s = 0;
      for (double x : v) m += x;
      m /= double(v.size());
      for (double x : v) s += (x - m) * (x - m);
      mean += m / 3.0;
      var += s / double(v.size() - 1) / 3.0;
    }
    CHECK(bn->running_mean.to_double_vector()[size_t(c)] == Approx(mean).epsilon(1e-5));
    CHECK(bn->running_var.to_double_vector()[size_t(c)] == Approx(var).epsilon(1e-5));
  }
  Sequential plain({std::make_shared<Linear>(2, 2, true, InitOptions{.gen = &gen})});
  CHECK(recompute_batch_norm_stats(plain, 1, [](int64_t) { FAIL("no BatchNorm: nothing runs"); }) == 0);
}
