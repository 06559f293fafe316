// Int8 depthwise convolution (ops/int8_depthwise.h): every path this CPU has (AVX-512 VNNI, AVX2,
// scalar) is bit-identical to the scalar int32 reference over shapes that exercise the vector body
// and the borders (stride 1, 2 and 3, kernels 1, 3 and 5, odd widths, padding 0 to 2, planes
// narrower than a vector, several blocks of images), including the extreme weights -128 and 127; the f32 and u8 epilogues equal the
// reference's requantization; the result is the f32 depthwise conv of the dequantized operands;
// bad shapes are errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "ops/int8_depthwise.h"
#include "ops/ops.h"
#include "tests/ops/int8_isa_paths.h"

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

TEST_CASE("int8 depthwise: bit-identical to the scalar reference, f32 and u8 epilogues, f32 conv agreement",
          "[quant][ops]") {
  MG_FOR_EACH_INT8_ISA();
  INFO("path " << int8_depthwise_path());
  for (Int8DepthwiseShape s : {Int8DepthwiseShape{.N = 2, .C = 3, .H = 7, .W = 37, .K = 3, .stride = 1, .padding = 1},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 9, .W = 16, .K = 3, .stride = 2, .padding = 1},
                               Int8DepthwiseShape{.N = 2, .C = 3, .H = 8, .W = 8, .K = 3, .stride = 2, .padding = 1},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 11, .W = 33, .K = 3, .stride = 2, .padding = 1},
                               Int8DepthwiseShape{.N = 3, .C = 5, .H = 4, .W = 4, .K = 3, .stride = 1, .padding = 1},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 5, .W = 21, .K = 5, .stride = 1, .padding = 2},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 6, .W = 7, .K = 1, .stride = 1, .padding = 0},
                               Int8DepthwiseShape{.N = 1, .C = 1, .H = 3, .W = 3, .K = 3, .stride = 1, .padding = 0},
                               Int8DepthwiseShape{.N = 1, .C = 2, .H = 65, .W = 70, .K = 3, .stride = 1, .padding = 1},
                               // several blocks of images per channel, the last one partial
                               Int8DepthwiseShape{.N = 5, .C = 2, .H = 40, .W = 40, .K = 3, .stride = 1, .padding = 1},
                               Int8DepthwiseShape{.N = 5, .C = 2, .H = 40, .W = 40, .K = 3, .stride = 2, .padding = 1},
                               Int8DepthwiseShape{.N = 2, .C = 1, .H = 9, .W = 10, .K = 5, .stride = 3, .padding = 2}}) {
    INFO("H " << s.H << " W " << s.W << " K " << s.K << " stride " << s.stride << " padding " << s.padding);
    auto x = random_ints<uint8_t>(s.N * s.C * s.H * s.W, 0, 255, 1);
    auto w = random_ints<int8_t>(s.C * s.K * s.K, -128, 127, 2);
    w[0] = -128;  // the extremes: (x - zx) * w in [-255 * 128, 255 * 128] must stay exact
    w.back() = 127;
    x[0] = 255;
    const int32_t zx = 37;
    const int64_t n_out = s.N * s.C * s.OH() * s.OW();
    std::vector<int32_t> ref(static_cast<size_t>(n_out)), fast(static_cast<size_t>(n_out), -1);
    int8_depthwise_ref(s, x.data(), zx, w.data(), ref.data());
    int8_depthwise(s, x.data(), zx, w.data(), {.i32 = fast.data()});
    CHECK(fast == ref);

    std::vector<float> scale(static_cast<size_t>(s.C)), bias(static_cast<size_t>(s.C)), y(static_cast<size_t>(n_out));
    for (int64_t c = 0; c < s.C; ++c) scale[size_t(c)] = 0.01f * float(c + 1), bias[size_t(c)] = 0.5f - float(c);
    const Requant q{.lo = -3.f, .hi = 6.f, .out_inv_scale = 1.f / 0.03f, .out_zero = 100};
    int8_depthwise(s, x.data(), zx, w.data(), {.f32 = y.data(), .scale = scale.data(), .bias = bias.data(), .q = q});
    std::vector<uint8_t> yq(static_cast<size_t>(n_out));
    int8_depthwise(s, x.data(), zx, w.data(), {.u8 = yq.data(), .scale = scale.data(), .bias = bias.data(), .q = q});
    const int64_t plane = s.OH() * s.OW();
    for (int64_t i = 0; i < n_out; ++i) {
      const int64_t c = (i / plane) % s.C;
      const float e = std::min(std::max(std::fma(float(ref[size_t(i)]), scale[size_t(c)], bias[size_t(c)]), -3.f), 6.f);
      if (y[size_t(i)] != e) FAIL_CHECK("element " << i << ": " << y[size_t(i)] << " vs " << e);
      if (yq[size_t(i)] != quantize_u8(e, q.out_inv_scale, q.out_zero)) FAIL_CHECK("u8 element " << i);
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

TEST_CASE("int8 depthwise: bad shapes and arguments are errors", "[quant][ops]") {
  std::vector<uint8_t> x(16, 1);
  std::vector<int8_t> w(9, 1);
  std::vector<int32_t> out(16);
  CHECK_THROWS_WITH(int8_depthwise({.N = 1, .C = 1, .H = 2, .W = 2, .K = 3, .stride = 1, .padding = 0}, x.data(), 0,
                                   w.data(), {.i32 = out.data()}),
                    Catch::Contains("int8_depthwise: invalid shape"));
  const Int8DepthwiseShape ok{.N = 1, .C = 1, .H = 4, .W = 4, .K = 3, .stride = 1, .padding = 1};
  CHECK_THROWS_WITH(int8_depthwise(ok, x.data(), 256, w.data(), {.i32 = out.data()}), Catch::Contains("zero point 256"));
  std::vector<float> y(16);
  CHECK_THROWS_WITH(int8_depthwise(ok, x.data(), 0, w.data(), {.f32 = y.data()}), Catch::Contains("per-channel scales"));
  CHECK_THROWS_WITH(int8_depthwise(ok, x.data(), 0, w.data(), {}), Catch::Contains("exactly one of"));
}
