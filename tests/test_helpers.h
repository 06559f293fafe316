// Helpers shared by the tests: random tensors from a seeded generator, bit-equality across
// devices, closeness checks with relative + absolute tolerance, and a gradcheck wrapper that
// reports the mismatch.
#pragma once
#include <cstdio>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace mg::test {

// Uniform in [lo, hi) from a seeded Philox stream; never all zeros.
inline Tensor rand_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double lo = -1.0,
                          double hi = 1.0, Device device = kCPU) {
  Generator g(seed);
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * double(g.uniform_at(i));
  return from_vector(v, shape, {.dtype = dtype, .device = device});
}

// a and b (any devices) hold the same bits; else the first element that differs.
inline void require_same_bits(const std::string& what, const Tensor& a, const Tensor& b) {
  INFO(what);
  REQUIRE(a.defined());
  REQUIRE(b.defined());
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const Tensor x = contiguous(to(a, kCPU)), y = contiguous(to(b, kCPU));
  if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0) return;
  const std::vector<double> u = x.to_double_vector(), w = y.to_double_vector();
  for (size_t i = 0; i < u.size(); ++i)
    if (std::memcmp(&u[i], &w[i], sizeof(double)) != 0)
      FAIL("element " << i << ": " << a.device().str() << " " << u[i] << " vs " << b.device().str() << " " << w[i]);
  FAIL("the bytes differ");
}

inline Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

inline bool all_close(const std::vector<double>& a, const std::vector<double>& b, double rtol = 1e-5,
                      double atol = 1e-7, std::string* why = nullptr) {
  if (a.size() != b.size()) {
    if (why) *why = "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i]))) {
      if (why) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "element %zu: %.17g vs %.17g (difference %.3g)", i, a[i], b[i],
                      std::abs(a[i] - b[i]));
        *why = buf;
      }
      return false;
    }
  return true;
}

inline void check_close(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-7) {
  REQUIRE(a.shape() == b.shape());
  std::string why;
  INFO(why);
  bool ok = all_close(a.to_double_vector(), b.to_double_vector(), rtol, atol, &why);
  INFO(why);
  CHECK(ok);
}

inline void check_values(const Tensor& a, const std::vector<double>& expected, double rtol = 1e-5, double atol = 1e-7) {
  std::string why;
  bool ok = all_close(a.to_double_vector(), expected, rtol, atol, &why);
  INFO(why);
  CHECK(ok);
}

inline void check_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                            const std::vector<Tensor>& inputs, GradcheckOptions opt = {}) {
  GradcheckResult r = gradcheck(fn, inputs, opt);
  INFO(r.message);
  CHECK(r.ok);
}

}  // namespace mg::test
