// The depthwise conv2d's channel-vectorised kernels (ops/conv2d_depthwise_lanes.cpp) at 16 lanes
// (AVX-512), 8 lanes (AVX2) and 1 lane (scalar) against the plane-by-plane reference: output and
// dx bit for bit; dW the same bits at every lane width and within 1e-5 of the reference (its own
// summation order) and of a double-precision sum; over stride 1 and 2, padding 0..2, odd plane
// sizes (W not a multiple of the lanes, 1x1 planes), planes that dW tiles in strips of rows,
// channel counts that leave a partial block, 3x3 and 5x5 kernels, and bias; and f16/bf16, whose
// staged f32 images run the same lanes.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/engine.h"
#include "core/parallel.h"
#include "ops/conv2d_depthwise.h"
#include "ops/ops.h"

using namespace mg;
using detail::DepthwiseKernel;

namespace {

Tensor wave(const Shape& s, double freq, double scale) {
  std::vector<double> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(float(scale * std::sin(freq * double(i) + 0.3)));
  return from_vector(v, s);
}

struct Case {
  int64_t n, c, h, w, k, stride, pad;
  bool bias;
};

// y, dx, dW of one depthwise conv under the chosen kernel, its tensors in dtype dt (as f32 values).
std::vector<std::vector<float>> run(DepthwiseKernel kernel, const Case& t, DType dt = DType::f32) {
  detail::set_depthwise_kernel(kernel);
  Tensor x = cast(wave({t.n, t.c, t.h, t.w}, 0.37, 1.0), dt).set_requires_grad(true);
  Tensor w = cast(wave({t.c, 1, t.k, t.k}, 0.91, 0.6), dt).set_requires_grad(true);
  Tensor b = t.bias ? cast(wave({t.c}, 0.5, 0.2), dt).set_requires_grad(true) : Tensor();
  Tensor y = conv2d(x, w, b, {t.stride, t.pad, t.c});
  backward(y, cast(wave(y.shape(), 0.73, 1.0), dt));
  detail::set_depthwise_kernel(DepthwiseKernel::automatic);
  auto f32 = [](const Tensor& v) { return cast(v, DType::f32).to_vector<float>(); };
  return {f32(y), f32(x.grad()), f32(w.grad())};
}

size_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

}  // namespace

// The largest |v[i] - r[i]| over the largest |r[i]|.
double max_rel_diff(const std::vector<float>& v, const std::vector<float>& r) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    diff = std::max(diff, std::abs(double(v[i]) - double(r[i])));
    scale = std::max(scale, std::abs(double(r[i])));
  }
  return diff / scale;
}

TEST_CASE("depthwise conv2d: every lane width gives the reference's bits (dW its own, 1e-5)",
          "[conv][depthwise]") {
  const Case cases[] = {
      {3, 20, 4, 4, 3, 1, 1, true},    // MobileNetV2's 4x4 planes; 20 channels = 16 + a partial block
      {2, 17, 8, 8, 3, 1, 1, false},   // 8x8: full runs of 8 in dW
      {2, 9, 8, 8, 3, 2, 1, true},     // stride 2
      {2, 5, 16, 16, 3, 1, 1, false},  // 16x16 at 16 lanes: the largest tile
      {2, 8, 7, 5, 3, 1, 1, true},     // W not a multiple of anything
      {2, 8, 7, 9, 3, 2, 1, false},    // odd sizes, stride 2
      {2, 3, 1, 1, 3, 1, 1, true},     // 1x1 planes: only the centre tap is in bounds
      {1, 4, 6, 6, 3, 1, 0, false},    // no padding
      {2, 6, 9, 11, 5, 2, 2, true},    // 5x5, padding 2
      {2, 6, 10, 10, 3, 3, 2, false},  // stride 3: dx positions no output reads
      {2, 19, 33, 35, 3, 1, 1, true},  // dW in strips of rows (output and dx: the reference)
      {2, 5, 31, 33, 3, 2, 1, false},  // strips at stride 2, odd sizes
  };
  for (const Case& t : cases) {
    const auto ref = run(DepthwiseKernel::reference, t);
    const auto scalar = run(DepthwiseKernel::scalar, t);
    for (DepthwiseKernel k : {DepthwiseKernel::scalar, DepthwiseKernel::lanes8, DepthwiseKernel::lanes16}) {
      const auto got = run(k, t);
      INFO("case n" << t.n << " c" << t.c << " " << t.h << "x" << t.w << " k" << t.k << " s"
                    << t.stride << " p" << t.pad << ", kernel " << int(k));
      CHECK(bit_diffs(got[0], ref[0]) == 0);  // y
      CHECK(bit_diffs(got[1], ref[1]) == 0);  // dx
      CHECK(bit_diffs(got[2], scalar[2]) == 0);  // dW: one order at every lane width
      // Two f32 orders of up to 2 x 1155 products (with cancellation): measured 2.2e-6 at most.
      CHECK(max_rel_diff(got[2], ref[2]) < 1e-5);
    }
  }
}

// The 16-bit kernels stage groups of images in f32 and run the lanes on them (before, the plane
// kernels: 4x slower on 4x4 planes); rounded on store, the results keep the reference's bits.
TEST_CASE("depthwise conv2d: f16 and bf16 run the lanes on their staged images with the reference's bits",
          "[conv][depthwise]") {
  const Case cases[] = {
      {3, 20, 4, 4, 3, 1, 1, true},    // 4x4 planes, a partial block, bias
      {2, 17, 8, 8, 3, 2, 1, false},   // stride 2
      {2, 19, 33, 35, 3, 1, 1, true},  // planes beyond the tiles: the reference for y and dx
  };
  for (DType dt : {DType::bf16, DType::f16})
    for (const Case& t : cases) {
      const auto ref = run(DepthwiseKernel::reference, t, dt);
      const auto scalar = run(DepthwiseKernel::scalar, t, dt);
      for (DepthwiseKernel k : {DepthwiseKernel::automatic, DepthwiseKernel::scalar, DepthwiseKernel::lanes8,
                                DepthwiseKernel::lanes16}) {
        const auto got = run(k, t, dt);
        INFO(dtype_name(dt) << " case c" << t.c << " " << t.h << "x" << t.w << " s" << t.stride << ", kernel " << int(k));
        CHECK(bit_diffs(got[0], ref[0]) == 0);     // y
        CHECK(bit_diffs(got[1], ref[1]) == 0);     // dx
        CHECK(bit_diffs(got[2], scalar[2]) == 0);  // dW: one order at every lane width
        CHECK(max_rel_diff(got[2], ref[2]) < 1e-2);  // two f32 orders, rounded to 16 bits
      }
    }
}

TEST_CASE("depthwise conv2d lanes dW agrees with a double-precision sum", "[conv][depthwise]") {
  for (const Case& t : {Case{3, 21, 32, 32, 3, 1, 1, false}, Case{2, 18, 9, 13, 3, 2, 1, false}}) {
    Tensor x = wave({t.n, t.c, t.h, t.w}, 0.37, 1.0);
    Tensor w = wave({t.c, 1, t.k, t.k}, 0.91, 0.6).set_requires_grad(true);
    Tensor y = conv2d(x, w, Tensor(), {t.stride, t.pad, t.c});
    Tensor dy = wave(y.shape(), 0.73, 1.0);
    backward(y, dy);
    const auto xv = x.to_vector<float>(), dv = dy.to_vector<float>();
    const auto gv = w.grad().to_vector<float>();
    const int64_t OH = y.size(2), OW = y.size(3);
    for (int64_t c = 0; c < t.c; ++c)
      for (int64_t kh = 0; kh < t.k; ++kh)
        for (int64_t kw = 0; kw < t.k; ++kw) {
          double s = 0, mag = 0;
          for (int64_t n = 0; n < t.n; ++n)
            for (int64_t oh = 0; oh < OH; ++oh)
              for (int64_t ow = 0; ow < OW; ++ow) {
                const int64_t ih = oh * t.stride - t.pad + kh, iw = ow * t.stride - t.pad + kw;
                if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
                const double p = double(dv[size_t(((n * t.c + c) * OH + oh) * OW + ow)]) *
                                 xv[size_t(((n * t.c + c) * t.h + ih) * t.w + iw)];
                s += p, mag += std::abs(p);
              }
          INFO("c " << c << " tap " << kh << "," << kw);
          CHECK(std::abs(gv[size_t((c * t.k + kh) * t.k + kw)] - s) <= 1e-6 * mag + 1e-30);
        }
  }
}

TEST_CASE("depthwise conv2d lanes kernel gives the same bits on 1 and 2 threads", "[conv][depthwise]") {
  const int saved = num_threads();
  const Case t{4, 40, 8, 8, 3, 1, 1, true};
  set_num_threads(1);
  const auto one = run(DepthwiseKernel::lanes16, t);
  set_num_threads(2);
  const auto two = run(DepthwiseKernel::lanes16, t);
  set_num_threads(saved);
  for (size_t o = 0; o < one.size(); ++o) CHECK(bit_diffs(one[o], two[o]) == 0);
}

TEST_CASE("depthwise conv2d lanes kernel agrees with a naive loop", "[conv][depthwise]") {
  // The reference and the lanes kernel could share a mistake; this checks the forward against
  // the definition, summed in double.
  const Case t{2, 19, 5, 7, 3, 2, 1, true};
  Tensor x = wave({t.n, t.c, t.h, t.w}, 0.37, 1.0), w = wave({t.c, 1, t.k, t.k}, 0.91, 0.6), b = wave({t.c}, 0.5, 0.2);
  detail::set_depthwise_kernel(DepthwiseKernel::lanes16);
  Tensor y = conv2d(x, w, b, {t.stride, t.pad, t.c});
  detail::set_depthwise_kernel(DepthwiseKernel::automatic);
  const auto xv = x.to_vector<float>(), wv = w.to_vector<float>(), bv = b.to_vector<float>(), yv = y.to_vector<float>();
  const int64_t OH = y.size(2), OW = y.size(3);
  for (int64_t n = 0; n < t.n; ++n)
    for (int64_t c = 0; c < t.c; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = bv[size_t(c)];
          for (int64_t kh = 0; kh < t.k; ++kh)
            for (int64_t kw = 0; kw < t.k; ++kw) {
              const int64_t ih = oh * t.stride - t.pad + kh, iw = ow * t.stride - t.pad + kw;
              if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
              s += double(wv[size_t((c * t.k + kh) * t.k + kw)]) * xv[size_t(((n * t.c + c) * t.h + ih) * t.w + iw)];
            }
          CHECK(yv[size_t(((n * t.c + c) * OH + oh) * OW + ow)] == Approx(s).margin(1e-5));
        }
}
