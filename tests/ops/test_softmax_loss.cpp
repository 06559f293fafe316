// softmax, log_softmax, cross_entropy and mse_loss: values against PyTorch, f64 gradcheck (any
// dim, transposed inputs, ignore_index), numerical stability, f16/bf16 within their precision,
// meta shapes, error messages, and that cross_entropy saves only the logits plus N floats.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "core/allocator.h"
#include "core/rng.h"
#include "ops/ops.h"

using namespace mg;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Uniform values in [lo, hi) from a fixed seed.
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

Tensor targets(const std::vector<int64_t>& v, DType dt = DType::i64) {
  return from_vector(std::vector<double>(v.begin(), v.end()), {int64_t(v.size())}, {.dtype = dt});
}

}  // namespace

TEST_CASE("softmax and log_softmax match PyTorch along either dim", "[softmax]") {
  Tensor x = from_vector({0.5, -1.0, 2.0, 3.0, 0.0, -0.5}, {2, 3}, {.dtype = DType::f64});
  // torch.softmax(x, 1), torch.softmax(x, 0), torch.log_softmax(x, 1) in float64 (torch 1.13)
  std::vector<double> sm1 = {0.1752903921400367, 0.039112573270687456, 0.7855970345892759,
                             0.9259392562016979, 0.04609980105300302,  0.027960942745299075};
  std::vector<double> sm0 = {0.07585818002124356, 0.2689414213699951, 0.9241418199787566,
                             0.9241418199787566,  0.7310585786300049, 0.07585818002124356};
  expect_close(softmax(x, 1).to_vector<double>(), sm1, 1e-12);
  expect_close(softmax(x, 0).to_vector<double>(), sm0, 1e-12);
  expect_close(log_softmax(x, -1).to_vector<double>(),
               {-1.7413112966571571, -3.241311296657157, -0.24131129665715703, -0.07694664454192604,
                -3.076946644541926, -3.576946644541926}, 1e-12);
  // A transposed (non-contiguous) input: softmax over its dim 1 is softmax(x, 0) transposed.
  Tensor st = softmax(transpose(x, 0, 1), 1);
  expect_close(contiguous(transpose(st, 0, 1)).to_vector<double>(), sm0, 1e-12);
}

TEST_CASE("softmax is stable for large logits and f32 matches f64", "[softmax]") {
  Tensor x = from_vector({1000.0, 1001.0, 1002.0, -1000.0, -1001.0, -1002.0}, {2, 3});
  std::vector<double> y = softmax(x, 1).to_vector<double>();
  std::vector<double> ly = log_softmax(x, 1).to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) {
    CHECK(std::isfinite(y[i]));
    CHECK(std::isfinite(ly[i]));
  }
  // exp(k) / (1 + e + e^2) for k = 0, 1, 2; the second row is the first reversed.
  double z = 1 + std::exp(1.0) + std::exp(2.0);
  expect_close(y, {1 / z, std::exp(1.0) / z, std::exp(2.0) / z, std::exp(2.0) / z, std::exp(1.0) / z, 1 / z}, 1e-6);
  expect_close(ly, {-std::log(z), 1 - std::log(z), 2 - std::log(z), 2 - std::log(z), 1 - std::log(z), -std::log(z)},
               1e-5);
}

TEST_CASE("softmax and log_softmax pass gradcheck on every dim and strided inputs", "[softmax]") {
  Tensor x = leaf(uniform({3, 4, 2}, 1));
  for (int64_t d : {0, 1, 2, -1}) {
    INFO("dim " << d);
    expect_gradcheck([d](auto& v) { return softmax(v[0], d); }, {x});
    expect_gradcheck([d](auto& v) { return log_softmax(v[0], d); }, {x});
  }
  Tensor base = leaf(uniform({5, 3}, 2));
  expect_gradcheck([](auto& v) { return softmax(transpose(v[0], 0, 1), 1); }, {base});
  expect_gradcheck([](auto& v) { return log_softmax(transpose(v[0], 0, 1), 0); }, {base});
  Tensor s = leaf(uniform({}, 3));  // 0-d: softmax is 1, its gradient 0
  expect_gradcheck([](auto& v) { return softmax(v[0], 0); }, {s});
}

TEST_CASE("softmax in f16 and bf16 tracks f32", "[softmax]") {
  Tensor x = uniform({4, 16}, 4, DType::f32, -4, 4);
  std::vector<double> ref = softmax(x, 1).to_vector<double>();
  std::vector<double> lref = log_softmax(x, 1).to_vector<double>();
  for (auto [dt, tol] : {std::pair{DType::f16, 2e-3}, std::pair{DType::bf16, 1.6e-2}}) {
    INFO(dt);
    Tensor xl = cast(x, dt);
    Tensor y = softmax(xl, 1), ly = log_softmax(xl, 1);
    CHECK(y.dtype() == dt);
    // The low-precision input itself is rounded, so compare against f32 on the rounded input.
    expect_close(y.to_vector<double>(), softmax(cast(xl, DType::f32), 1).to_vector<double>(), tol);
    expect_close(ly.to_vector<double>(), log_softmax(cast(xl, DType::f32), 1).to_vector<double>(), tol);
    expect_close(y.to_vector<double>(), ref, 4 * tol);
    expect_close(ly.to_vector<double>(), lref, 4 * tol);
  }
}

TEST_CASE("softmax on meta gives shapes and checks its input", "[softmax]") {
  Tensor m = empty({2, 5, 7}, {.device = kMeta});
  m.set_requires_grad(true);
  Tensor y = log_softmax(m, 1);
  CHECK(y.is_meta());
  CHECK(y.shape() == Shape{2, 5, 7});
  backward(sum(y));  // backward runs on meta too, allocating only
  CHECK(m.grad().shape() == Shape{2, 5, 7});
  Tensor ix = zeros({2, 3}, {.dtype = DType::i64});
  CHECK_THROWS_WITH(softmax(ix, 1), Catch::Contains("softmax") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(log_softmax(zeros({2, 3}), 2), Catch::Contains("log_softmax") && Catch::Contains("out of range"));
}

TEST_CASE("cross_entropy matches PyTorch with ignore_index and i32 or i64 targets", "[loss]") {
  Tensor logits = from_vector({0.2, -1.3, 0.7, 2.1, 1.5, 0.3, -0.8, 0.0, -0.4, 0.9, 0.1, -2.0}, {3, 4},
                              {.dtype = DType::f64});
  // torch.nn.functional.cross_entropy(logits, t) in float64 (torch 1.13)
  CHECK(cross_entropy(logits, targets({0, 2, 1})).item() == Approx(1.872488155958748).epsilon(1e-12));
  CHECK(cross_entropy(logits, targets({3, -100, 1})).item() == Approx(0.4661065837933189).epsilon(1e-12));
  CHECK(cross_entropy(logits, targets({3, -100, 1}, DType::i32)).item() == Approx(0.4661065837933189).epsilon(1e-12));
  // A custom ignore_index; and the mean of the rows kept equals the 2-row loss.
  CHECK(cross_entropy(logits, targets({3, 0, 1}), 0).item() == Approx(0.4661065837933189).epsilon(1e-12));
  // Non-contiguous logits: the transpose of a (4, 3) tensor.
  Tensor lt = transpose(contiguous(transpose(logits, 0, 1)), 0, 1);
  REQUIRE(!lt.is_contiguous());
  CHECK(cross_entropy(lt, targets({0, 2, 1})).item() == Approx(1.872488155958748).epsilon(1e-12));
  // f32 agrees.
  CHECK(cross_entropy(cast(logits, DType::f32), targets({0, 2, 1})).item() == Approx(1.872488155958748).epsilon(1e-6));
}

TEST_CASE("cross_entropy passes gradcheck, with ignored rows and strided logits", "[loss]") {
  Tensor x = leaf(uniform({5, 4}, 5));
  Tensor t = targets({3, -100, 0, 1, 3});
  expect_gradcheck([&](auto& v) { return cross_entropy(v[0], t); }, {x});
  expect_gradcheck([&](auto& v) { return cross_entropy(v[0], targets({1, 2, 0, 3, 2}, DType::i32)); }, {x});
  Tensor xt = leaf(uniform({4, 5}, 6));
  expect_gradcheck([&](auto& v) { return cross_entropy(transpose(v[0], 0, 1), t); }, {xt});
  // The loss scaled by a non-unit gradient: (softmax - onehot) * dout / count.
  expect_gradcheck([&](auto& v) { return mul(cross_entropy(v[0], t), 3.5); }, {x});
}

TEST_CASE("cross_entropy on an all-ignored batch is 0 with a zero gradient", "[loss]") {
  Tensor x = leaf(uniform({3, 4}, 7));
  Tensor loss = cross_entropy(x, targets({-100, -100, -100}));
  CHECK(loss.item() == 0.0);  // PyTorch gives NaN (0 / 0); memgrad treats padding as no loss
  backward(loss);
  for (double g : x.grad().to_vector<double>()) CHECK(g == 0.0);
}

TEST_CASE("cross_entropy rejects bad targets, shapes, dtypes and devices", "[loss]") {
  Tensor x = uniform({3, 4}, 8, DType::f32);
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 4, 1})),
                    Catch::Contains("cross_entropy") && Catch::Contains("target 4") && Catch::Contains("[0, 4)"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 1, -1}, DType::i32)), Catch::Contains("target -1 at position 2"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 1})), Catch::Contains("cross_entropy") && Catch::Contains("(3,)") && Catch::Contains("(2,)"));
  CHECK_THROWS_WITH(cross_entropy(reshape(x, {12}), targets({0})), Catch::Contains("(N, C)"));
  CHECK_THROWS_WITH(cross_entropy(x, zeros({3})), Catch::Contains("i64 or i32") && Catch::Contains("f32"));
  CHECK_THROWS_WITH(cross_entropy(zeros({3, 4}, {.dtype = DType::i64}), targets({0, 1, 2})),
                    Catch::Contains("floating"));
  Tensor t1 = zeros({3}, {.dtype = DType::i64, .device = "cpu:1"});
  CHECK_THROWS_WITH(cross_entropy(x, t1), Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
}

TEST_CASE("cross_entropy on meta and in f16/bf16", "[loss]") {
  Tensor m = empty({6, 10}, {.device = kMeta});
  m.set_requires_grad(true);
  Tensor loss = cross_entropy(m, empty({6}, {.dtype = DType::i64, .device = kMeta}));
  CHECK(loss.is_meta());
  CHECK(loss.dim() == 0);
  backward(loss);
  CHECK(m.grad().shape() == Shape{6, 10});

  Tensor x = uniform({8, 12}, 9, DType::f32, -3, 3);
  Tensor t = targets({0, 11, 5, 3, -100, 7, 2, 9});
  for (auto [dt, tol] : {std::pair{DType::f16, 2e-3}, std::pair{DType::bf16, 1.6e-2}}) {
    INFO(dt);
    Tensor xl = leaf(cast(x, dt));
    Tensor l = cross_entropy(xl, t);
    CHECK(l.dtype() == dt);
    CHECK(l.item() == Approx(cross_entropy(cast(xl, DType::f32), t).item()).epsilon(tol));
    backward(l);
    Tensor xf = leaf(cast(xl.detach(), DType::f32));
    backward(cross_entropy(xf, t));
    expect_close(xl.grad().to_vector<double>(), xf.grad().to_vector<double>(), tol);
  }
}

// Saved state of cross_entropy: the logits themselves (already counted) plus lse, N floats.
// No (N, C) tensor exists at any point of forward: the activation peak is the logits plus N + 1.
TEST_CASE("cross_entropy saves only the logits plus N floats", "[loss]") {
  const Device dev("cpu:11");
  const int64_t N = 64, C = 1000;
  Tensor x = uniform({N, C}, 10, DType::f32);
  Tensor logits = empty({N, C}, {.device = dev});
  copy_(logits, x);
  logits.set_requires_grad(true);
  Tensor t = empty({N}, {.dtype = DType::i64, .device = dev});
  {
    std::vector<double> tv(N);
    for (int64_t i = 0; i < N; ++i) tv[size_t(i)] = double((i * 37) % C);
    copy_(t, from_vector(tv, {N}, {.dtype = DType::i64}));
  }
  auto act = [&] { return memory_stats(dev).category(MemoryCategory::activation); };
  const int64_t logits_bytes = N * C * 4;  // 256000, a multiple of the 512-byte rounding
  const int64_t before = act().current;
  reset_peak_stats(dev);
  Tensor loss = cross_entropy(logits, t);
  const int64_t lse_bytes = 512;   // N = 64 floats, rounded up to 512 bytes
  const int64_t loss_bytes = 512;  // the 0-d output
  CHECK(act().current - before == lse_bytes + loss_bytes);
  CHECK(act().peak - before == lse_bytes + loss_bytes);
  CHECK(act().current >= logits_bytes);  // the saved logits are the caller's tensor, still live
  // Backward frees lse and writes an (N, C) gradient, nothing more.
  backward(loss);
  CHECK(act().current - before == loss_bytes);
  CHECK(logits.grad().shape() == Shape{N, C});
  CHECK(memory_stats(dev).category(MemoryCategory::gradient).current >= logits_bytes);
  // And the values: mean of lse - x[target] agrees with log_softmax.
  Tensor ref = log_softmax(x, 1);
  std::vector<double> lp = ref.to_vector<double>();
  double want = 0;
  for (int64_t i = 0; i < N; ++i) want -= lp[size_t(i * C + (i * 37) % C)];
  CHECK(loss.item() == Approx(want / N).epsilon(1e-5));
}

TEST_CASE("mse_loss matches PyTorch and passes gradcheck for both inputs", "[loss]") {
  Tensor a = from_vector({1.0, 2.0, -0.5, 0.25, 3.0, -1.0}, {2, 3}, {.dtype = DType::f64});
  Tensor b = from_vector({0.5, 2.5, 0.5, 0.0, 1.0, -1.5}, {2, 3}, {.dtype = DType::f64});
  CHECK(mse_loss(a, b).item() == Approx(0.96875).epsilon(1e-14));  // torch mse_loss, float64
  Tensor x = leaf(uniform({3, 4}, 11)), y = leaf(uniform({3, 4}, 12));
  expect_gradcheck([](auto& v) { return mse_loss(v[0], v[1]); }, {x, y});
  Tensor xt = leaf(uniform({4, 3}, 13));
  expect_gradcheck([](auto& v) { return mse_loss(transpose(v[0], 0, 1), v[1]); }, {xt, y});
  Tensor y_const = uniform({3, 4}, 14);  // target without grad
  expect_gradcheck([&](auto& v) { return mse_loss(v[0], y_const); }, {x});
}

TEST_CASE("mse_loss on meta, in f16/bf16, and its errors", "[loss]") {
  Tensor m = empty({4, 3}, {.device = kMeta});
  CHECK(mse_loss(m, m).is_meta());
  CHECK(mse_loss(m, m).dim() == 0);
  Tensor a = uniform({5, 7}, 15, DType::f32), b = uniform({5, 7}, 16, DType::f32);
  for (auto [dt, tol] : {std::pair{DType::f16, 2e-3}, std::pair{DType::bf16, 1.6e-2}}) {
    INFO(dt);
    Tensor al = cast(a, dt), bl = cast(b, dt);
    CHECK(mse_loss(al, bl).item() == Approx(mse_loss(cast(al, DType::f32), cast(bl, DType::f32)).item()).epsilon(tol));
  }
  CHECK_THROWS_WITH(mse_loss(a, zeros({5, 1})), Catch::Contains("mse_loss") && Catch::Contains("(5, 7) vs (5, 1)"));
  CHECK_THROWS_WITH(mse_loss(a, cast(b, DType::f64)), Catch::Contains("mse_loss") && Catch::Contains("f64"));
  CHECK_THROWS_WITH(mse_loss(a, zeros({5, 7}, {.device = "cpu:1"})), Catch::Contains("cpu:1"));
}
