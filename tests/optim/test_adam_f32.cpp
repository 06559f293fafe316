// The f32 Adam / AdamW update runs 16 or 8 lanes at a time (optim/adam.cpp); it must round as
// Note [AdamW's f32 roundings] says, lane body and scalar tail alike. Here an f32 parameter whose
// size is not a multiple of the lanes takes three steps, and every element is compared bit for bit
// with the Note's formula evaluated one element at a time.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "optim/adam.h"
#include "ops/ops.h"

using namespace mg;

namespace {

// One step of the Note's formula on plain arrays (t: the step count after incrementing).
void reference_step(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v,
                    double lr, double wd, int t, bool decoupled) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const float decay = float(1 - lr * wd), fwd = float(wd), b1c = float(1 - b1), fb2 = float(b2), b2c = float(1 - b2);
  const float bc2 = float(std::sqrt(1 - std::pow(b2, t))), feps = float(eps), step = float(lr / (1 - std::pow(b1, t)));
  for (size_t i = 0; i < w.size(); ++i) {
    float d = g[i], wi = w[i];
    if (wd != 0) {
      if (decoupled) wi = wi * decay;
      else d = std::fma(fwd, wi, d);
    }
    m[i] = std::fma(d - m[i], b1c, m[i]);
    v[i] = std::fma(v[i], fb2, (b2c * d) * d);
    w[i] = std::fma(-step, m[i] / (std::sqrt(v[i]) / bc2 + feps), wi);
  }
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  std::memcpy(out.data(), t.data<float>(), out.size() * sizeof(float));
  return out;
}

}  // namespace

TEST_CASE("the f32 Adam and AdamW updates round as the Note's formula, lanes and tail", "[optim]") {
  for (int variant = 0; variant < 3; ++variant) {
    const bool decoupled = variant != 1;
    const double wd = variant == 2 ? 0.0 : 0.05, lr = 3e-3;
    INFO("variant " << variant);
    const int64_t n = 16 * 5 + 7;  // lanes of 16 and of 8, and a tail
    std::mt19937 rng(21);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Tensor p = empty({n});
    for (int64_t i = 0; i < n; ++i) p.data<float>()[i] = normal(rng);
    p.set_requires_grad(true);
    std::vector<float> w = values(p), m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    std::unique_ptr<Optimizer> opt;
    NamedTensors params{{"p", p}};
    if (decoupled) opt = std::make_unique<AdamW>(params, lr, wd);
    else opt = std::make_unique<Adam>(params, lr, wd);
    for (int t = 1; t <= 3; ++t) {
      Tensor g = empty({n});
      for (int64_t i = 0; i < n; ++i) g.data<float>()[i] = normal(rng) * (i % 5 == 0 ? 1e-4f : 1.0f);
      p.set_grad(g);
      opt->step();
      reference_step(w, values(g), m, v, lr, wd, t, decoupled);
    }
    const std::vector<float> got = values(p);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&got[size_t(i)], &w[size_t(i)], sizeof(float)) != 0;
    CHECK(differ == 0);
    const ParamState* s = opt->state("p");
    REQUIRE(s != nullptr);
    CHECK(values(s->tensors[0].second) == m);
    CHECK(values(s->tensors[1].second) == v);
  }
}
