// Knowledge distillation's loss (models/compress/distillation.h): the value against Hinton's
// formula written out in doubles, the soft term vanishing when the student equals the teacher,
// gradients against finite differences (the teacher gets none), and bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "models/compress/distillation.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;

namespace {

// (1 - w) CE + w T^2 mean_n KL(softmax(t_n / T) || softmax(s_n / T)), in plain doubles.
double reference(const std::vector<double>& s, const std::vector<double>& t, const std::vector<int64_t>& y,
                 int64_t c, double w, double temp) {
  const int64_t n = int64_t(y.size());
  auto log_softmax_row = [&](const std::vector<double>& x, int64_t row, double scale) {
    std::vector<double> out(static_cast<size_t>(c));
    double m = -INFINITY, z = 0.0;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, x[size_t(row * c + j)] / scale);
    for (int64_t j = 0; j < c; ++j) z += std::exp(x[size_t(row * c + j)] / scale - m);
    for (int64_t j = 0; j < c; ++j) out[size_t(j)] = x[size_t(row * c + j)] / scale - m - std::log(z);
    return out;
  };
  double ce = 0.0, kl = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    ce -= log_softmax_row(s, i, 1.0)[size_t(y[size_t(i)])];
    const std::vector<double> ls = log_softmax_row(s, i, temp), lt = log_softmax_row(t, i, temp);
    for (int64_t j = 0; j < c; ++j) kl += std::exp(lt[size_t(j)]) * (lt[size_t(j)] - ls[size_t(j)]);
  }
  return (1.0 - w) * ce / double(n) + w * temp * temp * kl / double(n);
}

}  // namespace

TEST_CASE("distillation: the loss is Hinton's (1 - w) CE + w T^2 KL", "[distillation]") {
  const std::vector<double> s = {1.0, -0.5, 2.0, 0.3, 0.0, 1.5, -1.0, 0.7, 2.2, -0.3, 0.1, 0.9};
  const std::vector<double> t = {0.4, 0.2, 3.0, -1.0, 1.0, 0.5, -0.5, 0.0, 1.2, 0.8, -0.7, 2.0};
  const std::vector<int64_t> y = {2, 1, 3};
  const Tensor st = from_vector(s, {3, 4}, {.dtype = DType::f64});
  const Tensor tt = from_vector(t, {3, 4}, {.dtype = DType::f64});
  const Tensor labels = from_vector(std::vector<double>{2, 1, 3}, {3}, {.dtype = DType::i64});
  for (const double w : {0.0, 0.3, 1.0})
    for (const double temp : {1.0, 4.0}) {
      const double got = distillation_loss(st, tt, labels, {.weight = w, .temperature = temp}).item();
      CHECK(got == Approx(reference(s, t, y, 4, w, temp)).epsilon(1e-12));
    }
  // Weight 0 is the plain cross-entropy exactly.
  CHECK(distillation_loss(st, tt, labels, {.weight = 0.0}).item() == cross_entropy(st, labels).item());
  // A student equal to its teacher: the soft term is zero, only the labels' share is left.
  CHECK(distillation_loss(st, st, labels, {.weight = 1.0, .temperature = 3.0}).item() == Approx(0.0).margin(1e-14));
  CHECK(distillation_loss(st, st, labels, {.weight = 0.25}).item() ==
        Approx(0.75 * cross_entropy(st, labels).item()).epsilon(1e-12));
  // f32 logits give the same value to f32 precision.
  const double f32 = distillation_loss(cast(st, DType::f32), cast(tt, DType::f32), labels, {}).item();
  CHECK(f32 == Approx(reference(s, t, y, 4, 0.5, 4.0)).epsilon(1e-6));
}

TEST_CASE("distillation: gradients reach the student only, and match finite differences", "[distillation]") {
  const Tensor labels = from_vector(std::vector<double>{0, 4, 2, 1}, {4}, {.dtype = DType::i64});
  const Tensor teacher = leaf(rand_tensor({4, 5}, 2, DType::f64, -2.0, 2.0));
  check_gradcheck([&](const std::vector<Tensor>& in) {
    return distillation_loss(in[0], teacher, labels, {.weight = 0.6, .temperature = 2.5});
  }, {leaf(rand_tensor({4, 5}, 1, DType::f64, -2.0, 2.0))});
  const Tensor student = leaf(rand_tensor({4, 5}, 3));
  backward(distillation_loss(student, teacher, labels, {.weight = 0.5}));
  CHECK(student.grad().defined());
  CHECK_FALSE(teacher.grad().defined());
}

TEST_CASE("distillation: bad input is a clear error", "[distillation]") {
  const Tensor a = rand_tensor({2, 3}, 1), labels = from_vector(std::vector<double>{0, 1}, {2}, {.dtype = DType::i64});
  CHECK_THROWS_WITH(distillation_loss(a, a, labels, {.weight = 1.5}), Catch::Contains("weight must be in [0, 1]"));
  CHECK_THROWS_WITH(distillation_loss(a, a, labels, {.temperature = 0.0}), Catch::Contains("temperature must be > 0"));
  CHECK_THROWS_WITH(distillation_loss(a, rand_tensor({2, 4}, 2), labels, {}), Catch::Contains("of one shape"));
  CHECK_THROWS_WITH(distillation_loss(rand_tensor({6}, 1), rand_tensor({6}, 2), labels, {}),
                    Catch::Contains("must both be (N, C)"));
}
