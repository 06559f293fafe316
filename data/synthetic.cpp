// two_spirals: see synthetic.h.
#include "data/synthetic.h"

#include <cmath>
#include <vector>

namespace mg {

LabeledPoints two_spirals(int64_t n_per_class, Generator& gen, double noise, Device device) {
  MG_CHECK(n_per_class > 0, "two_spirals: n_per_class must be positive, got ", n_per_class);
  const int64_t n = 2 * n_per_class;
  std::vector<double> xs(static_cast<size_t>(2 * n)), ys(static_cast<size_t>(n));
  const uint64_t t0 = gen.advance(uint64_t(n)), e0 = gen.advance(uint64_t(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % 2;
    const double t = gen.uniform_at(t0 + uint64_t(i));
    const double angle = 4.0 * M_PI * t + double(k) * M_PI, r = 0.1 + 0.9 * t;
    xs[size_t(2 * i)] = r * std::cos(angle) + noise * gen.normal_at(e0 + uint64_t(2 * i));
    xs[size_t(2 * i + 1)] = r * std::sin(angle) + noise * gen.normal_at(e0 + uint64_t(2 * i + 1));
    ys[size_t(i)] = double(k);
  }
  MemoryCategoryGuard tag(MemoryCategory::input);
  return {from_vector(xs, {n, 2}, {.device = device}), from_vector(ys, {n}, {.dtype = DType::i64, .device = device})};
}

}  // namespace mg
