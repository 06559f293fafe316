// Element-wise ops, views and reductions: values, gradcheck in f64 (with broadcasting and
// strided inputs), f16/bf16 within their precision, and meta shape inference.
#include <catch2/catch.hpp>

#include "core/parallel.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::check_gradcheck;
using test::leaf;
using test::rand_tensor;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

TEST_CASE("unary ops pass gradcheck", "[elementwise]") {
  Tensor x = leaf(rand_tensor({3, 4}, 11, DType::f64, -2, 2));
  Tensor pos = leaf(rand_tensor({3, 4}, 12, DType::f64, 0.5, 2));
  std::vector<std::pair<const char*, Fn>> fns = {
      {"neg", [](auto& v) { return neg(v[0]); }},       {"exp", [](auto& v) { return exp(v[0]); }},
      {"tanh", [](auto& v) { return tanh(v[0]); }},     {"sigmoid", [](auto& v) { return sigmoid(v[0]); }},
      {"relu", [](auto& v) { return relu(v[0]); }},     {"relu6", [](auto& v) { return relu6(mul(v[0], 4.0)); }},
      {"gelu", [](auto& v) { return gelu_tanh(v[0]); }}, {"silu", [](auto& v) { return silu(v[0]); }},
      {"abs", [](auto& v) { return abs(v[0]); }},
  };
  for (auto& entry : fns) {  // not a structured binding: clang 14 cannot capture one
    INFO(entry.first);
    auto& f = entry.second;
    check_gradcheck(f, {x});
  }
  check_gradcheck([](auto& v) { return log(v[0]); }, {pos});
  check_gradcheck([](auto& v) { return sqrt(v[0]); }, {pos});
  check_gradcheck([](auto& v) { return rsqrt(v[0]); }, {pos});
  check_gradcheck([](auto& v) { return pow(v[0], 2.5); }, {pos});
  check_gradcheck([](auto& v) { return rdiv(2.0, v[0]); }, {pos});
}

TEST_CASE("binary ops pass gradcheck with broadcasting and strided inputs", "[elementwise]") {
  Tensor a = leaf(rand_tensor({2, 3, 4}, 21, DType::f64, 0.5, 2));
  Tensor b = leaf(rand_tensor({3, 1}, 22, DType::f64, 0.5, 2));
  Tensor base = rand_tensor({4, 3, 2}, 23, DType::f64, 0.5, 2);
  Tensor strided = leaf(base);  // used through a transposed view below
  std::vector<std::pair<const char*, Fn>> fns = {
      {"add", [](auto& v) { return add(v[0], v[1]); }},     {"sub", [](auto& v) { return sub(v[0], v[1]); }},
      {"mul", [](auto& v) { return mul(v[0], v[1]); }},     {"div", [](auto& v) { return div(v[0], v[1]); }},
      {"pow", [](auto& v) { return pow(v[0], v[1]); }},     {"maximum", [](auto& v) { return maximum(v[0], v[1]); }},
      {"minimum", [](auto& v) { return minimum(v[0], v[1]); }},
  };
  for (auto& entry : fns) {  // not a structured binding: clang 14 cannot capture one
    INFO(entry.first);
    auto& f = entry.second;
    check_gradcheck(f, {a, b});
    check_gradcheck([&f](auto& v) { return f({transpose(v[0], 0, 2), v[1]}); }, {strided, b});
  }
  check_gradcheck([](auto& v) { return sub(mul(v[0], 3.0), div(v[0], 2.0)); }, {a});
  check_gradcheck([](auto& v) { return rsub(1.0, add(v[0], 2.0)); }, {a});
  check_gradcheck([](auto& v) { return where(gt(v[0], 1.0), v[0], v[1]); }, {a, b});
  check_gradcheck([](auto& v) { return masked_fill(v[0], lt(v[0], 1.0), -3.0); }, {a});
}

TEST_CASE("binary op values and comparisons", "[elementwise]") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector(std::vector<double>{10, 20}, {2});
  test::check_values(add(a, b), {11, 22, 13, 24});
  test::check_values(mul(a, 2.0), {2, 4, 6, 8});
  test::check_values(rsub(1.0, a), {0, -1, -2, -3});
  test::check_values(maximum(a, full({}, 2.5)), {2.5, 2.5, 3, 4});
  CHECK(gt(a, 2.0).to_vector<int>() == std::vector<int>{0, 0, 1, 1});
  CHECK(eq(a, a).dtype() == DType::b8);
  Tensor ia = from_vector(std::vector<double>{1, 2, 3}, {3}, {.dtype = DType::i64});
  CHECK(add(ia, ia).to_vector<int64_t>() == std::vector<int64_t>{2, 4, 6});
  CHECK_THROWS_WITH(exp(ia), Catch::Contains("exp") && Catch::Contains("floating"));
}

TEST_CASE("f16 and bf16 element-wise ops track f32 within their precision", "[elementwise]") {
  Tensor x = rand_tensor({257}, 31, DType::f32, -3, 3);
  Tensor y = rand_tensor({257}, 32, DType::f32, -3, 3);
  Tensor ref = gelu_tanh(mul(x, y));
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor lo = gelu_tanh(mul(cast(x, dt), cast(y, dt)));
    CHECK(lo.dtype() == dt);
    double tol = dt == DType::f16 ? 4e-3 : 3e-2;
    test::check_close(cast(lo, DType::f32), ref, tol, tol);
  }
}

TEST_CASE("views pass gradcheck", "[views]") {
  Tensor x = leaf(rand_tensor({2, 3, 4}, 41));
  check_gradcheck([](auto& v) { return reshape(v[0], {6, 4}); }, {x});
  check_gradcheck([](auto& v) { return permute(v[0], {2, 0, 1}); }, {x});
  check_gradcheck([](auto& v) { return mul(transpose(v[0], 1, 2), 2.0); }, {x});
  check_gradcheck([](auto& v) { return narrow(v[0], 2, 1, 2); }, {x});
  check_gradcheck([](auto& v) { return slice(v[0], 2, 0, 4, 2); }, {x});
  check_gradcheck([](auto& v) { return select(v[0], 1, 1); }, {x});
  check_gradcheck([](auto& v) { return expand(narrow(v[0], 1, 0, 1), {5, 2, 3, 4}); }, {x});
  check_gradcheck([](auto& v) { return unsqueeze(squeeze(narrow(v[0], 1, 0, 1), 1), 0); }, {x});
  check_gradcheck([](auto& v) { return contiguous(transpose(v[0], 0, 2)); }, {x});
  check_gradcheck([](auto& v) { return flatten(transpose(v[0], 0, 1), 1); }, {x});
  check_gradcheck([](auto& v) { return cast(cast(v[0], DType::f32), DType::f64); }, {x}, {.eps = 1e-3, .atol = 1e-4, .rtol = 1e-3});
  check_gradcheck([](auto& v) { return to(to(v[0], Device("cpu:1")), kCPU); }, {x});
}

TEST_CASE("reductions: values and gradcheck", "[reduce]") {
  Tensor a = from_vector(std::vector<double>{1, 5, 3, 4, 2, 6}, {2, 3}, {.dtype = DType::f64});
  test::check_values(sum(a), {21});
  test::check_values(sum(a, {0}), {5, 7, 9});
  test::check_values(sum(a, {1}, true), {9, 12});
  CHECK(sum(a, {1}, true).shape() == Shape{2, 1});
  test::check_values(mean(a, {-1}), {3, 4});
  test::check_values(var(a, {1}), {4, 4});
  test::check_values(var(a, {1}, 0), {8.0 / 3, 8.0 / 3});
  test::check_values(amax(a, 1), {5, 6});
  CHECK(argmax(a, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  test::check_values(max(a), {6});
  CHECK(sum(gt(a, 2.0)).item<int>() == 4);
  Tensor x = leaf(rand_tensor({3, 4, 5}, 51));
  check_gradcheck([](auto& v) { return sum(v[0]); }, {x});
  check_gradcheck([](auto& v) { return sum(v[0], {0, 2}); }, {x});
  check_gradcheck([](auto& v) { return mean(transpose(v[0], 0, 2), {1}, true); }, {x});
  check_gradcheck([](auto& v) { return var(v[0], {2}); }, {x});
  check_gradcheck([](auto& v) { return amax(v[0], 1); }, {x});
  check_gradcheck([](auto& v) { return max(v[0]); }, {x});
  check_gradcheck([](auto& v) { return sum_to(v[0], {4, 1}); }, {x});
}

TEST_CASE("a large sum has the same bits on 1 and 2 threads", "[reduce]") {
  Tensor x = rand_tensor({1 << 20}, 61, DType::f32);
  set_num_threads(1);
  double one = sum(x).item<double>();
  Tensor rows1 = sum(reshape(x, {1024, 1024}), {0});
  set_num_threads(2);
  double two = sum(x).item<double>();
  Tensor rows2 = sum(reshape(x, {1024, 1024}), {0});
  CHECK(one == two);
  CHECK(rows1.to_vector<double>() == rows2.to_vector<double>());
}

TEST_CASE("meta runs shape inference and allocation only", "[elementwise]") {
  Tensor a = empty({8, 1, 16}, {.device = kMeta});
  Tensor b = empty({4, 16}, {.device = kMeta});
  Tensor c = sum(gelu_tanh(add(a, b)), {2});
  CHECK(c.shape() == Shape{8, 4});
  CHECK(c.is_meta());
  CHECK(transpose(c, 0, 1).shape() == Shape{4, 8});
}
