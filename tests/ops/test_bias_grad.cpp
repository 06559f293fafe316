// bias_grad (ops/bias_grad.h): linear's bias gradient must have sum(dout, {0})'s bits for any
// shape, threads splitting its columns or not, and linear / gelu_linear must use it.
#include <catch2/catch.hpp>
#include <cstring>

#include "autograd/engine.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/bias_grad.h"
#include "ops/ops.h"

using namespace mg;

namespace {

Tensor normal(const Shape& s, uint64_t seed) {
  Tensor t = empty(s);
  Generator g(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = g.normal_at(uint64_t(i));
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * 4) == 0;
}

}  // namespace

TEST_CASE("bias_grad gives sum's bits, on 1 and 2 threads", "[matmul]") {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int64_t R : {1, 7, 1024})
      for (int64_t N : {1, 63, 64, 65, 256, 300}) {
        INFO("threads " << threads << " R " << R << " N " << N);
        Tensor g = normal({R, N}, uint64_t(R * 1000 + N));
        CHECK(same_bits(bias_grad(g), sum(g, {0})));
      }
  }
  set_num_threads(saved);
  // Not f32, or not contiguous: sum itself.
  Tensor gd = cast(normal({9, 5}, 1), DType::f64);
  CHECK(bias_grad(gd).to_vector<double>() == sum(gd, {0}).to_vector<double>());
  Tensor gt = transpose(normal({5, 9}, 2), 0, 1);
  CHECK(same_bits(bias_grad(gt), sum(gt, {0})));
}

TEST_CASE("linear and gelu_linear give their bias sum's bits", "[matmul]") {
  Tensor x = normal({6, 33, 40}, 3), w = normal({70, 40}, 4), dout = normal({6, 33, 70}, 5);
  Tensor b = normal({70}, 6).set_requires_grad(true);
  backward(linear(x, w, b), dout);
  CHECK(same_bits(b.grad(), sum(reshape(dout, {-1, 70}), {0})));
  Tensor b2 = normal({70}, 7).set_requires_grad(true);
  backward(gelu_linear(x, w, b2), dout);
  CHECK(same_bits(b2.grad(), sum(reshape(dout, {-1, 70}), {0})));
}
