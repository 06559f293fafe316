// LayerNorm sums its rows 8 at a time (Note [LayerNorm row sums] in ops/layer_norm.cpp): a row's
// output and input gradient must have the same bits whether it is normalised among other rows or
// alone, for row counts that leave partial groups and widths that are not multiples of the term
// blocks, and its variance terms must be squares rounded before they are added.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "autograd/engine.h"
#include "core/rng.h"
#include "ops/ops.h"

using namespace mg;

namespace {

Tensor normal(const Shape& s, uint64_t seed, float scale = 1.0f) {
  Tensor t = empty(s);
  Generator g(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * g.normal_at(uint64_t(i)) + 0.3f;
  return t;
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("layer_norm gives a row the same bits among other rows as alone", "[norm]") {
  for (int64_t C : {8, 48, 64, 100, 256, 513}) {
    const int64_t M = 21;  // two groups of 8 and a partial one
    INFO("C = " << C);
    Tensor x = normal({M, C}, 3, 2.0f), w = normal({C}, 4), b = normal({C}, 5), dy = normal({M, C}, 6);
    Tensor xl = x.detach().set_requires_grad(true);
    Tensor y = layer_norm(xl, w, b);
    backward(y, dy);
    for (int64_t i : {0, 7, 8, 15, 20}) {
      Tensor xi = contiguous(narrow(x, 0, i, 1)).set_requires_grad(true);
      Tensor yi = layer_norm(xi, w, b);
      backward(yi, contiguous(narrow(dy, 0, i, 1)));
      CHECK(same_bits(yi.data<float>(), y.data<float>() + i * C, C));
      CHECK(same_bits(xi.grad().data<float>(), xl.grad().data<float>() + i * C, C));
    }
  }
}

TEST_CASE("layer_norm's variance adds squares rounded before the add", "[norm]") {
  // Without weight and bias, y = (x - mean) * rstd: rstd follows from y, so a variance summed with
  // fused multiply-adds shows in the bits. Reference: the Note's formula, one row at a time.
  const int64_t M = 11, C = 96;
  Tensor x = normal({M, C}, 9, 3.0f);
  Tensor y = layer_norm(x, Tensor(), Tensor(), 1e-5);
  for (int64_t i = 0; i < M; ++i) {
    const float* xi = x.data<float>() + i * C;
    float m = 0;
    for (int64_t j = 0; j < C; ++j) m += xi[j];
    m /= float(C);
    float v = 0;
    for (int64_t j = 0; j < C; ++j) {
      volatile float sq = (xi[j] - m) * (xi[j] - m);  // rounded on its own
      v += sq;
    }
    const float r = 1.0f / std::sqrt(v / float(C) + 1e-5f);
    for (int64_t j = 0; j < C; ++j) {
      volatile float h = (xi[j] - m) * r;
      CHECK(y.data<float>()[i * C + j] == h);
    }
  }
}
