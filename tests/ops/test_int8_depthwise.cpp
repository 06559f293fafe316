// Int8 depthwise convolution (ops/int8_depthwise.h): the compiled path is bit-identical to the
// scalar int32 reference over shapes that exercise the vector body and the borders (stride 1 and
// 2, kernels 3 and 5, widths around 16), the f32 epilogue equals the reference's, the result is
// the f32 depthwise conv of the dequantized operands, and bad shapes or -128 weights are errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "ops/int8_depthwise.h"
#include "ops/ops.h"

using namespace mg;

namespace {

template <class T>
std::vector<T> random_ints(int64_t n, int lo, int hi, uint64_t seed) {
  Generator g(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(lo + int(g.uniform_at(uint64_t(i)) * float(hi - lo + 1)) % (hi - lo + 1));
  return v;
}

}  // namespace

TEST_CASE("int8 depthwise: bit-identical to the scalar reference, f32 epilogue, f32 conv agreement", "[quant][ops]") {
  INFO("path " << int8_depthwise_path());
  for (Int8DepthwiseShape s : {Int8DepthwiseShape{.N = 2, .C = 3, .H = 7, .W = 37, .K = 3, .stride = 1, .padding = 1},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 9, .W = 16, .K = 3, .stride = 2, .padding = 1},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 5, .W = 21, .K = 5, .stride = 1, .padding = 2},
                               Int8DepthwiseShape{.N = 1, .C = 1, .H = 3, .W = 3, .K = 3, .stride = 1, .padding = 0}}) {
    INFO("H " << s.H << " W " << s.W << " K " << s.K << " stride " << s.stride);
    const auto x = random_ints<uint8_t>(s.N * s.C * s.H * s.W, 0, 255, 1);
    const auto w = random_ints<int8_t>(s.C * s.K * s.K, -127, 127, 2);
    const int32_t zx = 37;
    const int64_t n_out = s.N * s.C * s.OH() * s.OW();
    std::vector<int32_t> ref(static_cast<size_t>(n_out)), fast(static_cast<size_t>(n_out));
    int8_depthwise_ref(s, x.data(), zx, w.data(), ref.data());
    int8_depthwise_i32(s, x.data(), zx, w.data(), fast.data());
    CHECK(fast == ref);

    std::vector<float> scale(static_cast<size_t>(s.C)), bias(static_cast<size_t>(s.C)), y(static_cast<size_t>(n_out));
    for (int64_t c = 0; c < s.C; ++c) scale[size_t(c)] = 0.01f * float(c + 1), bias[size_t(c)] = 0.5f - float(c);
    int8_depthwise_f32(s, x.data(), zx, w.data(), scale.data(), bias.data(), -3.f, 6.f, y.data());
    const int64_t plane = s.OH() * s.OW();
    for (int64_t i = 0; i < n_out; ++i) {
      const int64_t c = (i / plane) % s.C;
      const float e = std::min(std::max(std::fma(float(ref[size_t(i)]), scale[size_t(c)], bias[size_t(c)]), -3.f), 6.f);
      if (y[size_t(i)] != e) FAIL_CHECK("element " << i << ": " << y[size_t(i)] << " vs " << e);
    }

    // the same as the f32 depthwise conv of the dequantized values (x - zx) and w, with padding 0
    std::vector<double> xd(x.size()), wd(w.size());
    for (size_t i = 0; i < x.size(); ++i) xd[i] = double(int(x[i]) - zx);
    for (size_t i = 0; i < w.size(); ++i) wd[i] = double(w[i]);
    const Tensor conv = conv2d(from_vector(xd, {s.N, s.C, s.H, s.W}), from_vector(wd, {s.C, 1, s.K, s.K}), Tensor(),
                               {.stride = s.stride, .padding = s.padding, .groups = s.C});
    const auto cv = conv.to_double_vector();
    REQUIRE(int64_t(cv.size()) == n_out);
    for (int64_t i = 0; i < n_out; ++i)
      if (cv[size_t(i)] != double(ref[size_t(i)])) FAIL_CHECK("conv2d element " << i);
  }
}

TEST_CASE("int8 depthwise: bad shapes and out-of-range weights are errors", "[quant][ops]") {
  std::vector<uint8_t> x(16, 1);
  std::vector<int8_t> w(9, 1);
  std::vector<int32_t> out(16);
  CHECK_THROWS_WITH(int8_depthwise_i32({.N = 1, .C = 1, .H = 2, .W = 2, .K = 3, .stride = 1, .padding = 0}, x.data(), 0,
                                       w.data(), out.data()),
                    Catch::Contains("int8_depthwise: invalid shape"));
  w[4] = -128;
  CHECK_THROWS_WITH(int8_depthwise_i32({.N = 1, .C = 1, .H = 4, .W = 4, .K = 3, .stride = 1, .padding = 1}, x.data(), 0,
                                       w.data(), out.data()),
                    Catch::Contains("is -128"));
}
