// The fast element-wise paths: the vectorisable exp / tanh of ops/kernels/vec_math.h and the
// GELU-tanh functors against double references (bounds of Note [vmath error]), special values,
// and the f16 / bf16 block loops of ops/cpu_loops.h giving the bits of the element-by-element formula on random bit patterns (NaN, inf, subnormals included).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "autograd/engine.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/kernels/vec_math.h"
#include "ops/ops.h"

using namespace mg;

namespace {

// One unit in the last place of a float of magnitude |r| (subnormal spacing below FLT_MIN).
double ulp_at(double r) {
  int e;
  std::frexp(r == 0 ? 1e-45 : r, &e);
  return std::max(std::ldexp(1.0, e - 24), 0x1p-149);
}

// Every 4099th float bit pattern (about a million values of every sign and exponent).
template <class F>
void for_float_grid(F&& f) {
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) f(bits_float(uint32_t(b)));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("vmath exp_f and tanh_f stay within 2 ulp of double over the float range", "[elementwise][gelu]") {
  double worst_exp = 0, worst_tanh = 0;
  float at_exp = 0, at_tanh = 0;
  int64_t nan_mismatch = 0;
  for_float_grid([&](float x) {
    float e = vmath::exp_f(x), t = vmath::tanh_f(x);
    if (std::isnan(x)) {
      nan_mismatch += !std::isnan(e) + !std::isnan(t);
      return;
    }
    double re = std::exp(double(x)), rt = std::tanh(double(x));
    double ee = (std::isinf(float(re)) && std::isinf(e)) ? 0 : std::fabs(double(e) - re) / ulp_at(re);
    double et = std::fabs(double(t) - rt) / ulp_at(rt);
    if (ee > worst_exp) worst_exp = ee, at_exp = x;
    if (et > worst_tanh) worst_tanh = et, at_tanh = x;
  });
  INFO("exp_f worst " << worst_exp << " ulp at x = " << at_exp << "; tanh_f worst " << worst_tanh << " ulp at x = " << at_tanh);
  CHECK(nan_mismatch == 0);
  CHECK(worst_exp <= 2.0);
  CHECK(worst_tanh <= 2.0);
  // Ends and signs, exactly.
  CHECK(vmath::exp_f(float(kInf)) == float(kInf));
  CHECK(vmath::exp_f(-float(kInf)) == 0.0f);
  CHECK(vmath::exp_f(89.0f) == float(kInf));
  CHECK(vmath::exp_f(0.0f) == 1.0f);
  CHECK(vmath::tanh_f(float(kInf)) == 1.0f);
  CHECK(vmath::tanh_f(-float(kInf)) == -1.0f);
  CHECK(vmath::tanh_f(30.0f) == 1.0f);
  CHECK(std::signbit(vmath::tanh_f(-0.0f)));
  CHECK(vmath::tanh_f(1e-30f) == 1e-30f);
}

TEST_CASE("GELU-tanh float functors track the double formula", "[elementwise][gelu]") {
  // Reference: 0.5 x (1 + tanh(u)) and its derivative, in double from the float x.
  const double k = 0.7978845608028654;
  double worst_abs_fwd = 0, worst_rel_fwd = 0, worst_bwd = 0;
  float at_fwd = 0, at_rel = 0, at_bwd = 0;
  auto check_x = [&](float x) {
    double xd = x, t = std::tanh(k * (xd + 0.044715 * xd * xd * xd));
    double rf = 0.5 * xd * (1 + t);
    double rb = 0.5 * (1 + t) + 0.5 * xd * k * (1 + 3 * 0.044715 * xd * xd) * (1 - t * t);
    float f = fn::GeluTanh{}(x), b = fn::GeluTanhBackward{}(1.0f, x);
    // Absolute, in roundings of max(1, |x|): the float formula rounds 1 + tanh(u) and 1 - tanh(u)^2
    // to 2^-24, so for x < -3 (where GELU is below 1e-3) it keeps no relative accuracy, as before
    // the fast tanh; relative, in ulp, where that cancellation is mild (x >= -1).
    double scale = std::max(1.0, std::fabs(xd)) * 0x1p-24;
    double abs_fwd = std::fabs(f - rf) / scale;
    double rel_fwd = xd >= -1 ? std::fabs(f - rf) / ulp_at(rf) : 0;
    double bwd = std::fabs(b - rb) / scale;
    if (abs_fwd > worst_abs_fwd) worst_abs_fwd = abs_fwd, at_fwd = x;
    if (rel_fwd > worst_rel_fwd) worst_rel_fwd = rel_fwd, at_rel = x;
    if (bwd > worst_bwd) worst_bwd = bwd, at_bwd = x;
  };
  for (int i = 0; i <= 200000; ++i) check_x(float(-12.0 + 24.0 * i / 200000));  // uniform in [-12, 12]
  for_float_grid([&](float x) {                                                    // dense near 0, and huge |x|
    if (std::isfinite(x) && std::fabs(x) < 1e6f) check_x(x);
  });
  INFO("forward abs " << worst_abs_fwd << " x max(1,|x|) 2^-24 at " << at_fwd << "; forward rel " << worst_rel_fwd
                      << " ulp at " << at_rel << "; backward " << worst_bwd << " x max(1,|x|) 2^-24 at " << at_bwd);
  CHECK(worst_abs_fwd <= 3.0);  // measured 1.72
  CHECK(worst_rel_fwd <= 5.0);  // measured 3.23
  CHECK(worst_bwd <= 4.0);      // measured 2.31

  // Special values as the tanh form 0.5 x (1 + tanh(u)) gave them.
  fn::GeluTanh f;
  fn::GeluTanhBackward b;
  float inf = float(kInf), nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(f(inf) == inf);
  CHECK(std::isnan(f(-inf)));
  CHECK(std::isnan(f(nan)));
  CHECK(f(-30.0f) == 0.0f);
  CHECK(std::signbit(f(-30.0f)));
  CHECK(f(30.0f) == 30.0f);
  CHECK(std::signbit(f(-0.0f)));
  CHECK(f(1e-40f) == 5e-41f);
  CHECK(b(1.0f, 0.0f) == 0.5f);
  CHECK(b(1.0f, 30.0f) == 1.0f);
  CHECK(b(1.0f, -30.0f) == 0.0f);
  CHECK(b(1.0f, 1e13f) == 1.0f);
  CHECK(b(1.0f, -1e13f) == 0.0f);
  CHECK(std::isnan(b(1.0f, inf)));
  CHECK(std::isnan(b(1.0f, -inf)));
  CHECK(std::isnan(b(1.0f, nan)));
  // The double instantiation (gradcheck, f64 tensors) agrees with the float one.
  for (double x : {-5.0, -1.0, -0.3, 0.0, 0.7, 2.0, 6.0}) {
    CHECK(fn::GeluTanh{}(x) == Approx(fn::GeluTanh{}(float(x))).epsilon(1e-6).margin(2e-6));
    CHECK(fn::GeluTanhBackward{}(1.0, x) == Approx(fn::GeluTanhBackward{}(1.0f, float(x))).epsilon(1e-6).margin(2e-6));
  }
}

namespace {

// n values of type T: half random bit patterns (every NaN / inf / subnormal class), half N(0, 3).
template <class T>
Tensor random_bits_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = empty(shape, {.dtype = dtype_of_v<T>});
  T* p = t.data<T>();
  Generator g(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float u = g.uniform_at(uint64_t(i));
    if (i % 2 == 0) p[i].bits = uint16_t(u * 65536.0f);
    else p[i] = T(3.0f * g.normal_at(uint64_t(i) + (uint64_t(1) << 40)));
  }
  p[0].bits = 0x7f80;  // some fixed specials at the front (bf16 +inf; an f16 NaN)
  p[1].bits = 0xff80;
  p[2].bits = 0x0001;
  p[3].bits = 0x8000;
  return t;
}

// Where both inputs of a binary op are NaN, which payload survives is the compiler's choice of
// operand order (x86 keeps the first), in the old element loop as much as in the blocks: any NaN.
constexpr int32_t kAnyNaN = -1;

template <class T>
bool same_bits(const Tensor& got, const std::vector<int32_t>& want, std::string* why) {
  const T* p = got.data<T>();
  for (size_t i = 0; i < want.size(); ++i) {
    bool ok = want[i] == kAnyNaN ? std::isnan(float(p[i])) : p[i].bits == uint16_t(want[i]);
    if (!ok) {
      *why = "element " + std::to_string(i) + ": bits " + std::to_string(p[i].bits) + " vs " + std::to_string(want[i]);
      return false;
    }
  }
  return true;
}

template <class T>
int32_t binary_want(float x, float y, float r) {
  return std::isnan(x) && std::isnan(y) ? kAnyNaN : int32_t(T(r).bits);
}

template <class T>
void check_16bit_bits() {
  const int64_t R = 37, C = 300;  // C not a multiple of the 256-element block
  Tensor a = random_bits_tensor<T>({R, C}, 5);
  Tensor b = random_bits_tensor<T>({C}, 6);
  Tensor g = random_bits_tensor<T>({R, C}, 7);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const T* pg = g.data<T>();
  std::string why;
  auto unary = [&](auto fn, const Tensor& out, const char* name) {
    std::vector<int32_t> want(size_t(R * C));
    for (int64_t i = 0; i < R * C; ++i) want[size_t(i)] = T(fn(float(pa[i]))).bits;
    INFO(name);
    bool ok = same_bits<T>(out, want, &why);
    INFO(why);
    CHECK(ok);
  };
  unary(fn::GeluTanh{}, gelu_tanh(a), "gelu_tanh");
  unary(fn::Silu{}, silu(a), "silu");
  unary(fn::Sigmoid{}, sigmoid(a), "sigmoid");
  unary(fn::Tanh{}, tanh(a), "tanh");
  unary(fn::Exp{}, exp(a), "exp");
  unary([](float v) { return v * float(0.25); }, mul(a, 0.25), "mul scalar");

  // Binary with b broadcast over rows (stride 0 on the outer dim).
  {
    std::vector<int32_t> want(size_t(R * C));
    for (int64_t i = 0; i < R * C; ++i) want[size_t(i)] = binary_want<T>(pa[i], pb[i % C], float(pa[i]) + float(pb[i % C]));
    INFO("add broadcast");
    bool ok = same_bits<T>(add(a, b), want, &why);
    INFO(why);
    CHECK(ok);
  }
  // Non-contiguous input: a transposed, (C, R) with strides (1, C).
  {
    std::vector<int32_t> want(size_t(R * C));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r) want[size_t(c * R + r)] = T(fn::GeluTanh{}(float(pa[r * C + c]))).bits;
    INFO("gelu_tanh on a transposed view");
    bool ok = same_bits<T>(gelu_tanh(transpose(a, 0, 1)), want, &why);
    INFO(why);
    CHECK(ok);
  }
  // GeluTanhBackward (cpu_map2 through autograd): dx = dout * gelu'(x).
  {
    Tensor x = a.detach();
    x.set_requires_grad(true);
    backward(gelu_tanh(x), g);
    std::vector<int32_t> want(size_t(R * C));
    for (int64_t i = 0; i < R * C; ++i) want[size_t(i)] = binary_want<T>(pg[i], pa[i], fn::GeluTanhBackward{}(float(pg[i]), float(pa[i])));
    INFO("GeluTanhBackward");
    bool ok = same_bits<T>(x.grad(), want, &why);
    INFO(why);
    CHECK(ok);
  }
  // where (cpu_map3) with a broadcast condition.
  {
    Tensor cond = gt(b, 0.0);
    std::vector<int32_t> want(size_t(R * C));
    for (int64_t i = 0; i < R * C; ++i) {
      T v = float(pb[i % C]) > 0 ? pa[i] : pg[i];
      want[size_t(i)] = T(float(v)).bits;  // where goes through float: a signalling NaN comes back quiet
    }
    INFO("where");
    bool ok = same_bits<T>(where(cond, a, g), want, &why);
    INFO(why);
    CHECK(ok);
  }
}

}  // namespace

TEST_CASE("bf16 element-wise blocks give the bits of the element-by-element formula", "[elementwise][gelu]") {
  check_16bit_bits<BFloat16>();
}

TEST_CASE("f16 element-wise blocks give the bits of the element-by-element formula", "[elementwise][gelu]") {
  check_16bit_bits<Half>();
}

TEST_CASE("f32 GELU-tanh kernels equal the scalar functor and do not depend on the thread count", "[elementwise][gelu]") {
  const int64_t n = 3 * 32768 + 77;  // several parallel chunks and a ragged tail
  Tensor x = empty({n});
  float* px = x.data<float>();
  Generator gen(9);
  for (int64_t i = 0; i < n; ++i) px[i] = 4.0f * gen.normal_at(uint64_t(i));
  int saved = num_threads();
  set_num_threads(1);
  Tensor y1 = gelu_tanh(x);
  set_num_threads(2);
  Tensor y2 = gelu_tanh(x);
  set_num_threads(saved);
  CHECK(std::memcmp(y1.data_ptr(), y2.data_ptr(), size_t(n) * 4) == 0);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += y1.data<float>()[i] != fn::GeluTanh{}(px[i]);
  CHECK(differ == 0);
}
