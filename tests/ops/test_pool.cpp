// Pooling: max/avg/global-average forward against PyTorch, f64 gradcheck (overlapping windows,
// padding, strided inputs), meta shapes, the bytes max_pool2d keeps for backward, error
// messages, f16/bf16 against f32, and bit-identical results with 1 and 2 threads.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "ops/ops.h"

using namespace mg;

namespace {

Tensor seq(const Shape& shape, const std::function<double(int64_t)>& f, DType dt = DType::f32, Device dev = kCPU) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = f(int64_t(i));
  return from_vector(v, shape, {.dtype = dt, .device = dev});
}
double fx(int64_t i) { return std::sin(0.37 * double(i) + 0.1); }

void check_close(const Tensor& t, const std::vector<double>& ref, double rtol, double atol) {
  std::vector<double> v = t.to_vector<double>();
  REQUIRE(v.size() == ref.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i << ": " << v[i] << " vs " << ref[i]);
    CHECK(std::abs(v[i] - ref[i]) <= atol + rtol * std::abs(ref[i]));
  }
}

}  // namespace

// Reference values: PyTorch 1.13 in f64, OMP_NUM_THREADS=2:
//   x = torch.tensor([sin(0.37*i + 0.1) for i in range(100)]).reshape(2, 2, 5, 5)
//   F.max_pool2d(x, k, s, p), F.avg_pool2d(x, k, s, p) (count_include_pad=True), x.mean((2, 3))
TEST_CASE("pooling forward matches PyTorch", "[pool]") {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = seq({2, 2, 5, 5}, fx, dt);
    const double tol = dt == DType::f32 ? 1e-6 : 1e-9;
    Tensor m = max_pool2d(x, {2, 0, 0});
    CHECK(m.shape() == Shape{2, 2, 2, 2});
    check_close(m, {0.928959715, 0.935616002, -0.260157491, 0.458951486, 0.0747082904, -0.253571464, 0.753670785,
                    0.999739337, 0.999560538, 0.758132222, -0.303964609, 0.126915561, 0.411713831, -0.310449745,
                    0.915809603, 0.947099195},
                tol, tol);
    Tensor mp = max_pool2d(x, {3, 2, 1});
    CHECK(mp.shape() == Shape{2, 2, 3, 3});
    check_close(mp, {0.928959715, 0.935616002, 0.999957646, 0.928959715, 0.732231444, 0.749174348, 0.999871709,
                     0.999871709, 0.749174348, 0.0747082904, -0.253571464, 0.11338502, 0.753670785, 0.999739337,
                     0.999739337, 0.72288135, 0.424095846, -0.297465357, 0.999560538, 0.921198109, 0.942637137,
                     0.999560538, 0.921198109, 0.477018086, 0.944890106, 0.999335319, 0.918525184, 0.411713831,
                     0.0543071524, -0.233743955, 0.915809603, 0.947099195, 0.999063691, 0.915809603, 0.708604981,
                     0.0475013079},
                tol, tol);
    Tensor ap = avg_pool2d(x, {3, 2, 1});
    check_close(ap, {0.245990096, 0.375919787, 0.192516676, -0.0732241976, -0.140739532, -0.0909470962,
                     0.120666513, 0.328807354, 0.262884064, -0.226102912, -0.383049557, -0.220720667, 0.0607734604,
                     0.134334197, 0.0959260729, -0.0782089356, -0.289604057, -0.259611378, 0.199326452, 0.37850794,
                     0.242199375, -0.046470977, -0.123835746, -0.0979822155, 0.0333683594, 0.241576626,
                     0.248428423, -0.166476583, -0.362433317, -0.256298352, 0.0307525391, 0.109564063,
                     0.097052874, 0.0124889391, -0.186188438, -0.22967594},
                tol, tol);
    Tensor a1 = avg_pool2d(x, {2, 1, 0});
    CHECK(a1.shape() == Shape{2, 2, 4, 4});
    check_close(a1, {0.553477715, 0.591539983, 0.549540089, 0.433162522, 0.0482138235, -0.168256307, -0.361953736,
                     -0.506662425, -0.580052234, -0.498800388, -0.35003825, -0.153900076, 0.271499653, 0.443185352,
                     0.554887992, 0.591489145, -0.508731553, -0.583474714, -0.57924731, -0.4966215, -0.150004013,
                     0.0670746136, 0.275075006, 0.445845286, 0.591410839, 0.546504496, 0.427631333, 0.250880275,
                     -0.175970105, -0.368297231, -0.510777055, -0.5841256, 0.448484516, 0.557631173, 0.591305067,
                     0.544948594, 0.247223632, 0.0361508204, -0.179814835, -0.371443397, -0.58474936, -0.5775568,
                     -0.492194637, -0.340216239, 0.0750788086, 0.282187222, 0.451102919, 0.558963951, -0.374572312,
                     -0.514796804, -0.585345964, -0.576671293, -0.336910433, -0.138274751, 0.0790757691,
                     0.285723755, 0.560270771, 0.59101115, 0.541760942, 0.419185933, 0.028100113, -0.187479066,
                     -0.377683833, -0.516770865},
                tol, tol);
    Tensor g = global_avg_pool2d(x);
    CHECK(g.shape() == Shape{2, 2});
    check_close(g, {0.21341383, -0.203700944, 0.187781361, -0.166140146}, tol, tol);
  }
}

TEST_CASE("max_pool2d routes the gradient to PyTorch's argmax", "[pool]") {
  // F.max_pool2d(x, 3, 2, 1, return_indices=True)[1]: the winner's h*W + w in its plane.
  const std::vector<int64_t> idx = {5, 3, 4, 5, 6, 19, 21, 21, 19, 0, 8, 9, 11, 13, 13, 15, 16, 18,
                                    5, 6, 4, 5, 6, 19, 21, 22, 23, 0, 1, 9, 15, 13, 14, 15, 16, 18};
  Tensor x = seq({2, 2, 5, 5}, fx).set_requires_grad(true);
  Tensor y = max_pool2d(x, {3, 2, 1});
  backward(sum(y));
  std::vector<double> expected(100, 0.0);
  for (size_t o = 0; o < idx.size(); ++o) expected[(o / 9) * 25 + size_t(idx[o])] += 1.0;  // overlapping windows add
  CHECK(x.grad().to_vector<double>() == expected);
}

TEST_CASE("pooling gradcheck", "[pool]") {
  Tensor x = seq({2, 3, 6, 5}, fx, DType::f64).set_requires_grad(true);
  struct Cfg {
    int64_t k, s, p;
  };
  for (Cfg c : {Cfg{2, 0, 0}, Cfg{3, 2, 1}, Cfg{3, 1, 1}, Cfg{2, 1, 1}, Cfg{1, 2, 0}}) {
    Pool2dParams prm{c.k, c.s, c.p};
    auto rm = gradcheck([&](const std::vector<Tensor>& in) { return max_pool2d(in[0], prm); }, {x});
    INFO("max k " << c.k << " s " << c.s << " p " << c.p << ": " << rm.message);
    CHECK(rm.ok);
    auto ra = gradcheck([&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], prm); }, {x});
    INFO("avg: " << ra.message);
    CHECK(ra.ok);
  }
  auto rg = gradcheck([](const std::vector<Tensor>& in) { return global_avg_pool2d(in[0]); }, {x});
  CHECK(rg.ok);
  // A transposed (non-contiguous) input.
  auto rt = gradcheck([](const std::vector<Tensor>& in) {
    Tensor v = transpose(in[0], 2, 3);
    return add(max_pool2d(v, {2, 1, 0}), sum(avg_pool2d(v, {3, 2, 1}), {2, 3}, true));
  }, {x});
  INFO(rt.message);
  CHECK(rt.ok);
  auto rgt = gradcheck([](const std::vector<Tensor>& in) { return global_avg_pool2d(transpose(in[0], 1, 3)); }, {x});
  CHECK(rgt.ok);
}

TEST_CASE("pooling on meta gives the output shapes", "[pool]") {
  Tensor x = empty({8, 16, 15, 15}, {.device = kMeta, .requires_grad = true});
  Tensor m = max_pool2d(x, {3, 2, 1});
  CHECK(m.shape() == Shape{8, 16, 8, 8});
  CHECK(avg_pool2d(x, {2, 0, 0}).shape() == Shape{8, 16, 7, 7});
  Tensor g = global_avg_pool2d(x);
  CHECK(g.shape() == Shape{8, 16});
  backward(add(sum(m), sum(g)));
  CHECK(x.grad().shape() == x.shape());
  CHECK(x.grad().is_meta());
}

TEST_CASE("max_pool2d keeps only i32 indices for backward, and none without grad", "[pool]") {
  const Device dev(DeviceType::cpu, 6);
  Tensor x = seq({4, 8, 16, 16}, fx, DType::f32, dev);  // 32 KiB
  auto extra_bytes = [&](bool grad) {
    x.set_requires_grad(grad);
    int64_t before = memory_stats(dev).allocated.current;
    Tensor y = max_pool2d(x, {2, 0, 0});
    return memory_stats(dev).allocated.current - before;
  };
  const int64_t out_bytes = 4 * 8 * 8 * 8 * 4;  // (4, 8, 8, 8) f32 = 8 KiB
  CHECK(extra_bytes(false) == out_bytes);
  CHECK(extra_bytes(true) == 2 * out_bytes);  // + (4, 8, 8, 8) i32 indices, not the 32 KiB input
}

TEST_CASE("pooling input errors name the op and the shapes", "[pool]") {
  Tensor x = zeros({1, 2, 5, 5});
  CHECK_THROWS_WITH(max_pool2d(x, {3, 1, 2}), Catch::Contains("max_pool2d: padding 2 must be at most half the kernel size 3"));
  CHECK_THROWS_WITH(avg_pool2d(x, {7, 1, 0}),
                    Catch::Contains("avg_pool2d: output size 0x0 is not positive: input (1, 2, 5, 5), kernel 7"));
  CHECK_THROWS_WITH(max_pool2d(zeros({2, 5, 5}), {2, 0, 0}),
                    Catch::Contains("max_pool2d: input (N, C, H, W) must have 4 dimensions, got shape (2, 5, 5)"));
  CHECK_THROWS_WITH(global_avg_pool2d(zeros({2, 5})), Catch::Contains("global_avg_pool2d: input (N, C, H, W) must have 4"));
  CHECK_THROWS_WITH(avg_pool2d(x, {0, 0, 0}), Catch::Contains("avg_pool2d: invalid parameters kernel 0"));
  CHECK_THROWS_WITH(max_pool2d(zeros({1, 2, 5, 5}, {.dtype = DType::i64}), {2, 0, 0}),
                    Catch::Contains("max_pool2d: expected a floating tensor"));
}

TEST_CASE("pooling f16 and bf16 track f32", "[pool]") {
  for (DType low : {DType::f16, DType::bf16}) {
    Tensor x = cast(cast(seq({2, 3, 7, 6}, fx), low), DType::f32).set_requires_grad(true);
    Tensor xl = cast(x.detach(), low).set_requires_grad(true);
    const double tol = low == DType::f16 ? 1e-3 : 8e-3;
    Tensor m = max_pool2d(x, {3, 2, 1}), ml = max_pool2d(xl, {3, 2, 1});
    CHECK(ml.dtype() == low);
    CHECK(ml.to_vector<double>() == m.to_vector<double>());  // max of rounded inputs is exact
    Tensor a = avg_pool2d(x, {3, 1, 1}), al = avg_pool2d(xl, {3, 1, 1});
    check_close(al, a.to_vector<double>(), tol, tol);
    Tensor g = global_avg_pool2d(x), gl = global_avg_pool2d(xl);
    check_close(gl, g.to_vector<double>(), tol, tol);
    backward(add(sum(m), add(sum(a), sum(g))));
    backward(add(sum(ml), add(sum(al), sum(gl))));
    check_close(xl.grad(), x.grad().to_vector<double>(), tol, tol);
  }
}

TEST_CASE("pooling gives the same bits with 1 and 2 threads", "[pool]") {
  auto run = [](int threads) {
    set_num_threads(threads);
    Tensor x = seq({4, 16, 18, 18}, fx).set_requires_grad(true);
    Tensor y = add(sum(max_pool2d(x, {3, 2, 1}), {2, 3}), add(sum(avg_pool2d(x, {3, 1, 1}), {2, 3}), global_avg_pool2d(x)));
    backward(y, seq(y.shape(), [](int64_t i) { return std::cos(0.7 * double(i)); }));
    return std::vector<std::vector<double>>{y.to_vector<double>(), x.grad().to_vector<double>()};
  };
  const int saved = num_threads();
  auto one = run(1), two = run(2);
  set_num_threads(saved);
  CHECK(one == two);
}
