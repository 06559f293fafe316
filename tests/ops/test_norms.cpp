// layer_norm and batch_norm: values against PyTorch, f64 gradcheck for x, weight and bias (with
// optional parameters missing, transposed inputs, training and eval), running statistics and
// their version bump, thread-count independence, f16/bf16, meta shapes and error messages.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/ops.h"

using namespace mg;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor uniform(const Shape& s, uint64_t seed, DType dt = DType::f64, double lo = -2, double hi = 2) {
  Generator g(seed);
  std::vector<double> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * g.uniform_at(i);
  return from_vector(v, s, {.dtype = dt});
}

Tensor leaf(Tensor t) { return t.set_requires_grad(true); }

void expect_gradcheck(const Fn& f, const std::vector<Tensor>& in) {
  GradcheckResult r = gradcheck(f, in);
  INFO(r.message);
  CHECK(r.ok);
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

Tensor f64(std::vector<double> v, Shape s) { return from_vector(v, s, {.dtype = DType::f64}); }

}  // namespace

TEST_CASE("layer_norm matches PyTorch", "[norm]") {
  Tensor x = f64({1.0, -2.0, 0.5, 3.0, 0.1, 0.2, -0.3, 0.4}, {2, 4});
  Tensor w = f64({1.5, -0.5, 2.0, 1.0}, {4}), b = f64({0.1, 0.2, -0.1, 0.0}, {4});
  // torch.nn.functional.layer_norm(x, (4,), w, b, 1e-5) in float64 (torch 1.13)
  expect_close(layer_norm(x, w, b).to_vector<double>(),
               {0.41583758498295564, 0.9369543649602299, -0.24037225999242476, 1.3335364699280348,
                0.09999999999999984, 0.0038989489779124864, -3.2376168163534014, 1.1766063061325254}, 1e-10);
  // Without parameters every row has mean 0 and (biased) variance 1 / (1 + eps / var).
  std::vector<double> y = layer_norm(uniform({3, 8}, 1), Tensor(), Tensor()).to_vector<double>();
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 8; ++j) m += y[size_t(r * 8 + j)] / 8;
    for (int j = 0; j < 8; ++j) v += (y[size_t(r * 8 + j)] - m) * (y[size_t(r * 8 + j)] - m) / 8;
    CHECK(std::abs(m) < 1e-12);
    CHECK(v == Approx(1.0).epsilon(1e-4));
  }
}

TEST_CASE("layer_norm passes gradcheck with and without weight and bias", "[norm]") {
  Tensor x = leaf(uniform({2, 3, 5}, 2));
  Tensor w = leaf(uniform({5}, 3)), b = leaf(uniform({5}, 4));
  expect_gradcheck([](auto& v) { return layer_norm(v[0], v[1], v[2]); }, {x, w, b});
  expect_gradcheck([](auto& v) { return layer_norm(v[0], Tensor(), Tensor()); }, {x});
  expect_gradcheck([](auto& v) { return layer_norm(v[0], v[1], Tensor()); }, {x, w});
  expect_gradcheck([&](auto& v) { return layer_norm(v[0], Tensor(), b.detach()); }, {x});
  // Only the parameters need gradients; and a transposed (non-contiguous) input.
  Tensor xc = uniform({2, 3, 5}, 5);
  expect_gradcheck([&](auto& v) { return layer_norm(xc, v[0], v[1]); }, {w, b});
  expect_gradcheck([&](auto& v) { return layer_norm(xc, Tensor(), v[0]); }, {b});
  Tensor xt = leaf(uniform({5, 4}, 6));
  Tensor w4 = leaf(uniform({5}, 7));
  expect_gradcheck([](auto& v) { return layer_norm(transpose(v[0], 0, 1), v[1], Tensor()); }, {xt, w4});
  // More rows than one dweight block (32 rows), so the block partials are summed.
  Tensor big = leaf(uniform({70, 3}, 8));
  Tensor w3 = leaf(uniform({3}, 9)), b3 = leaf(uniform({3}, 10));
  expect_gradcheck([](auto& v) { return layer_norm(v[0], v[1], v[2]); }, {big, w3, b3});
}

TEST_CASE("layer_norm backward has the same bits on 1 and 2 threads", "[norm]") {
  Tensor x = uniform({300, 16}, 11, DType::f32), w = uniform({16}, 12, DType::f32);
  Tensor r = uniform({300, 16}, 13, DType::f32);
  auto grads = [&](int threads) {
    int prev = num_threads();
    set_num_threads(threads);
    Tensor xl = leaf(clone(x)), wl = leaf(clone(w));  // fresh leaves per call
    backward(sum(mul(layer_norm(xl, wl, Tensor()), r)));
    set_num_threads(prev);
    std::vector<double> g = xl.grad().to_vector<double>(), gw = wl.grad().to_vector<double>();
    g.insert(g.end(), gw.begin(), gw.end());
    return g;
  };
  CHECK(grads(1) == grads(2));
}

TEST_CASE("layer_norm on meta, in f16/bf16, and its errors", "[norm]") {
  Tensor m = empty({2, 7, 16}, {.device = kMeta});
  m.set_requires_grad(true);
  Tensor wm = leaf(empty({16}, {.device = kMeta}));
  Tensor y = layer_norm(m, wm, Tensor());
  CHECK(y.is_meta());
  CHECK(y.shape() == Shape{2, 7, 16});
  backward(sum(y));
  CHECK(m.grad().shape() == Shape{2, 7, 16});
  CHECK(wm.grad().shape() == Shape{16});

  Tensor x = uniform({6, 32}, 14, DType::f32), w = uniform({32}, 15, DType::f32), b = uniform({32}, 16, DType::f32);
  for (auto [dt, tol] : {std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 3e-2}}) {
    INFO(dt);
    Tensor xl = cast(x, dt), wl = cast(w, dt), bl = cast(b, dt);
    Tensor yl = layer_norm(xl, wl, bl);
    CHECK(yl.dtype() == dt);
    Tensor ref = layer_norm(cast(xl, DType::f32), cast(wl, DType::f32), cast(bl, DType::f32));
    expect_close(yl.to_vector<double>(), ref.to_vector<double>(), tol);
  }
  CHECK_THROWS_WITH(layer_norm(x, zeros({31}), Tensor()),
                    Catch::Contains("layer_norm") && Catch::Contains("weight") && Catch::Contains("(32,)"));
  CHECK_THROWS_WITH(layer_norm(x, Tensor(), zeros({32}, {.dtype = DType::f64})),
                    Catch::Contains("layer_norm") && Catch::Contains("f64"));
  CHECK_THROWS_WITH(layer_norm(x, zeros({32}, {.device = "cpu:1"}), Tensor()),
                    Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
  CHECK_THROWS_WITH(layer_norm(zeros({2, 3}, {.dtype = DType::i32}), Tensor(), Tensor()), Catch::Contains("floating"));
}

// The (2, 2, 2, 2) input of the PyTorch reference below.
static Tensor bn_input() {
  return f64({1.0, -0.5, 2.0, 0.3, 0.7, 1.1, -1.2, 0.0, -0.4, 0.6, 1.5, -2.0, 0.9, -0.1, 0.2, 0.8}, {2, 2, 2, 2});
}

TEST_CASE("batch_norm matches PyTorch in training and eval, updating running stats", "[norm]") {
  Tensor x = bn_input();
  Tensor rm = f64({0.1, -0.2}, {2}), rv = f64({1.5, 0.5}, {2});
  Tensor w = f64({1.2, -0.7}, {2}), b = f64({0.3, 0.1}, {2});
  uint64_t v0 = rm.version(), v1 = rv.version();
  // torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5), then
  // the same with training=False on the updated rm, rv (float64, torch 1.13).
  expect_close(batch_norm(x, rm, rv, w, b, true).to_vector<double>(),
               {0.9932763929861051, -0.5193266462563062, 2.0016784191477126, 0.28739497467297986,
                -0.29999591842981976, -0.6999918368596397, 1.5999846941118243, 0.39999693882236487,
                -0.4184864436401454, 0.5899155825214621, 1.497477406066909, -2.0319296854987177,
                -0.49999387764472975, 0.49999591842981983, 0.19999897960745494, -0.3999948980372748}, 1e-10);
  expect_close(rm.to_vector<double>(), {0.12125000000000001, -0.15000000000000002}, 1e-12);
  expect_close(rv.to_vector<double>(), {1.5118392857142857, 0.506}, 1e-12);  // unbiased batch var
  CHECK(rm.version() > v0);
  CHECK(rv.version() > v1);
  expect_close(batch_norm(x, rm, rv, w, b, false).to_vector<double>(),
               {1.1576149331654348, -0.306308139094198, 2.1335636480051905, 0.47445083277760625,
                -0.7364450509828895, -1.1300662514454258, 1.1332556512141576, -0.0476079501734511,
                -0.20871326761022252, 0.7672354472295329, 1.6455892905853127, -1.770231211353831,
                -0.9332556512141575, 0.05079734994218296, -0.24441855040471921, -0.8348503510985236}, 1e-10);
  CHECK(rm.to_vector<double>()[0] == Approx(0.12125));  // eval leaves the running stats alone

  // (N, C) input, no parameters; f32 running stats next to an f64 input.
  Tensor x2 = f64({1.0, 2.0, 3.0, -1.0, 0.5, 0.0}, {3, 2});
  Tensor rm2 = zeros({2}), rv2 = ones({2});
  expect_close(batch_norm(x2, rm2, rv2, Tensor(), Tensor(), true).to_vector<double>(),
               {-0.4629080659988156, 1.336301914312872, 1.3887241979964464, -1.0690415314502975,
                -0.9258161319976311, -0.26726038286257436}, 1e-10);
  expect_close(rm2.to_vector<double>(), {0.15, 0.033333333333333333}, 1e-6);
  expect_close(rv2.to_vector<double>(), {1.075, 1.1333333333333333}, 1e-6);

  // Training without running stats: batch statistics only, nothing to update.
  expect_close(batch_norm(x2, Tensor(), Tensor(), Tensor(), Tensor(), true).to_vector<double>(),
               {-0.4629080659988156, 1.336301914312872, 1.3887241979964464, -1.0690415314502975,
                -0.9258161319976311, -0.26726038286257436}, 1e-10);
}

TEST_CASE("batch_norm passes gradcheck for x, weight and bias in training and eval", "[norm]") {
  Tensor x = leaf(uniform({3, 2, 2, 3}, 20));
  Tensor w = leaf(uniform({2}, 21)), b = leaf(uniform({2}, 22));
  Tensor rm = uniform({2}, 23), rv = uniform({2}, 24, DType::f64, 0.5, 2);
  // Training without running stats keeps gradcheck's repeated forwards free of side effects.
  expect_gradcheck([](auto& v) { return batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true); }, {x, w, b});
  expect_gradcheck([](auto& v) { return batch_norm(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }, {x});
  expect_gradcheck([&](auto& v) { return batch_norm(v[0], rm, rv, v[1], v[2], false); }, {x, w, b});
  expect_gradcheck([&](auto& v) { return batch_norm(v[0], rm, rv, Tensor(), v[1], false); }, {x, b});
  Tensor x2 = leaf(uniform({5, 3}, 25));
  Tensor w3 = leaf(uniform({3}, 26)), b3 = leaf(uniform({3}, 27));
  expect_gradcheck([](auto& v) { return batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true); }, {x2, w3, b3});
  // Parameters only, and a permuted (channels-last storage) input.
  Tensor xc = uniform({3, 2, 2, 3}, 28);
  expect_gradcheck([&](auto& v) { return batch_norm(xc, Tensor(), Tensor(), v[0], v[1], true); }, {w, b});
  expect_gradcheck([&](auto& v) { return batch_norm(xc, Tensor(), Tensor(), Tensor(), v[0], true); }, {b});
  Tensor xp = leaf(uniform({3, 2, 3, 2}, 29));  // (N, H, W, C) storage
  expect_gradcheck([&](auto& v) { return batch_norm(permute(v[0], {0, 3, 1, 2}), Tensor(), Tensor(), v[1], v[2], true); },
                   {xp, w, b});
}

TEST_CASE("batch_norm training with running stats still differentiates, version guards them", "[norm]") {
  Tensor x = leaf(uniform({4, 3}, 30));
  Tensor rm = zeros({3}, {.dtype = DType::f64}), rv = ones({3}, {.dtype = DType::f64});
  Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), true);
  backward(sum(mul(y, uniform({4, 3}, 31))));
  CHECK(x.grad().defined());
  // The saved statistics are copies: updating the buffers again does not break backward.
  Tensor x2 = leaf(uniform({4, 3}, 32));
  Tensor y2 = batch_norm(x2, rm, rv, Tensor(), Tensor(), false);
  batch_norm(uniform({4, 3}, 33), rm, rv, Tensor(), Tensor(), true);
  REQUIRE_NOTHROW(backward(sum(y2)));
}

TEST_CASE("batch_norm on meta, in f16/bf16, and its errors", "[norm]") {
  Tensor m = leaf(empty({4, 8, 5, 5}, {.device = kMeta}));
  Tensor rm = zeros({8}, {.device = kMeta}), rv = ones({8}, {.device = kMeta});
  Tensor y = batch_norm(m, rm, rv, Tensor(), Tensor(), true);
  CHECK(y.is_meta());
  CHECK(y.shape() == Shape{4, 8, 5, 5});
  backward(sum(y));
  CHECK(m.grad().shape() == Shape{4, 8, 5, 5});

  Tensor x = uniform({4, 3, 2, 5}, 34, DType::f32), w = uniform({3}, 35, DType::f32), b = uniform({3}, 36, DType::f32);
  for (auto [dt, tol] : {std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 3e-2}}) {
    INFO(dt);
    Tensor xl = cast(x, dt), wl = cast(w, dt), bl = cast(b, dt);
    Tensor rml = zeros({3}), rvl = ones({3});  // f32 running stats with 16-bit activations
    Tensor yl = batch_norm(xl, rml, rvl, wl, bl, true);
    CHECK(yl.dtype() == dt);
    Tensor ref = batch_norm(cast(xl, DType::f32), Tensor(), Tensor(), cast(wl, DType::f32), cast(bl, DType::f32), true);
    expect_close(yl.to_vector<double>(), ref.to_vector<double>(), tol);
  }
  Tensor x2 = zeros({4, 3});
  CHECK_THROWS_WITH(batch_norm(x2, Tensor(), Tensor(), Tensor(), Tensor(), false),
                    Catch::Contains("batch_norm") && Catch::Contains("eval") && Catch::Contains("running"));
  CHECK_THROWS_WITH(batch_norm(zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                    Catch::Contains("more than 1 value per channel"));
  CHECK_THROWS_WITH(batch_norm(x2, Tensor(), Tensor(), zeros({4}), Tensor(), true),
                    Catch::Contains("weight") && Catch::Contains("(3,)") && Catch::Contains("(4,)"));
  CHECK_THROWS_WITH(batch_norm(zeros({2, 3, 4}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                    Catch::Contains("(N, C, H, W) or (N, C)") && Catch::Contains("(2, 3, 4)"));
  CHECK_THROWS_WITH(batch_norm(x2, zeros({3}, {.device = "cpu:1"}), ones({3}, {.device = "cpu:1"}), Tensor(),
                               Tensor(), true),
                    Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
  CHECK_THROWS_WITH(batch_norm(x2, zeros({3}), Tensor(), Tensor(), Tensor(), true), Catch::Contains("both"));
}

TEST_CASE("batch_norm in f32 tracks f64 on planes longer than a block, with the same bits on 1 and 2 threads",
          "[norm]") {
  // 3 x 4 planes of 30 x 30 = 900 values (more than one 512-value block), offset by 5 so the
  // centred second pass matters; an f64 run of the same values is the reference.
  Tensor x = add(uniform({3, 4, 30, 30}, 41, DType::f32), 5.0), r = uniform({3, 4, 30, 30}, 42, DType::f32);
  Tensor w = uniform({4}, 43, DType::f32), b = uniform({4}, 44, DType::f32);
  auto run = [&](DType dt, int threads) {
    int prev = num_threads();
    set_num_threads(threads);
    Tensor xl = leaf(clone(cast(x, dt))), wl = leaf(clone(cast(w, dt))), bl = leaf(clone(cast(b, dt)));
    Tensor rm = zeros({4}, {.dtype = dt}), rv = ones({4}, {.dtype = dt});
    Tensor y = batch_norm(xl, rm, rv, wl, bl, true);
    backward(sum(mul(y, cast(r, dt))));
    set_num_threads(prev);
    std::vector<double> out = y.to_vector<double>();
    for (const Tensor& t : {xl.grad(), wl.grad(), bl.grad(), rm, rv}) {
      std::vector<double> v = t.to_vector<double>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  std::vector<double> one = run(DType::f32, 1);
  CHECK(one == run(DType::f32, 2));
  expect_close(one, run(DType::f64, 2), 2e-5);
}

TEST_CASE("batch_norm normalises a 16-bit input with f32 weight and bias (mixed precision)", "[norm]") {
  Tensor x = uniform({4, 3, 6, 5}, 51, DType::f32), r = uniform({4, 3, 6, 5}, 52, DType::f32);
  Tensor w = uniform({3}, 53, DType::f32), b = uniform({3}, 54, DType::f32);
  for (auto [dt, tol] : {std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 3e-2}}) {
    INFO(dt);
    Tensor xl = leaf(cast(x, dt)), wl = leaf(clone(w)), bl = leaf(clone(b));
    Tensor rm = zeros({3}), rv = ones({3});
    Tensor y = batch_norm(xl, rm, rv, wl, bl, true);
    CHECK(y.dtype() == dt);
    backward(sum(mul(y, cast(r, dt))));
    CHECK(xl.grad().dtype() == dt);
    CHECK(wl.grad().dtype() == DType::f32);
    CHECK(bl.grad().dtype() == DType::f32);
    // The reference: the same (rounded) input in f32 throughout.
    Tensor xf = leaf(cast(xl.detach(), DType::f32)), wf = leaf(clone(w)), bf = leaf(clone(b));
    Tensor rmf = zeros({3}), rvf = ones({3});
    Tensor yf = batch_norm(xf, rmf, rvf, wf, bf, true);
    backward(sum(mul(yf, cast(cast(r, dt), DType::f32))));
    expect_close(y.to_vector<double>(), yf.to_vector<double>(), tol);
    expect_close(xl.grad().to_vector<double>(), xf.grad().to_vector<double>(), tol);
    expect_close(wl.grad().to_vector<double>(), wf.grad().to_vector<double>(), 1e-5);  // f32 sums of 16-bit terms
    expect_close(bl.grad().to_vector<double>(), bf.grad().to_vector<double>(), 1e-5);
    expect_close(rm.to_vector<double>(), rmf.to_vector<double>(), 1e-6);
    expect_close(rv.to_vector<double>(), rvf.to_vector<double>(), 1e-6);
    // Only the bias needs a gradient: it is still an f32 sum.
    Tensor bo = leaf(clone(b));
    backward(sum(mul(batch_norm(cast(x, dt), Tensor(), Tensor(), w, bo, true), cast(r, dt))));
    CHECK(bo.grad().dtype() == DType::f32);
    expect_close(bo.grad().to_vector<double>(), bf.grad().to_vector<double>(), 1e-5);
  }
  Tensor x16 = cast(x, DType::bf16);
  CHECK_THROWS_WITH(batch_norm(x, Tensor(), Tensor(), cast(w, DType::bf16), Tensor(), true),
                    Catch::Contains("weight") && Catch::Contains("f32") && Catch::Contains("bf16"));
  CHECK_THROWS_WITH(batch_norm(x16, Tensor(), Tensor(), cast(w, DType::f16), Tensor(), true),
                    Catch::Contains("weight") && Catch::Contains("or f32") && Catch::Contains("f16"));
  CHECK_THROWS_WITH(batch_norm(x16, Tensor(), Tensor(), w, cast(b, DType::bf16), true),
                    Catch::Contains("weight and bias must have one dtype"));
}
