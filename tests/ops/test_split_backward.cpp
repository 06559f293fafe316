// split's backward is one SplitBackward node for all parts: the parts' gradients side by side in
// one tensor of the input's shape (zeros for a part that got none), the values a narrow per part
// gave, and one input-sized gradient allocation where there were one per part.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::check_gradcheck;
using test::check_values;
using test::leaf;
using test::rand_tensor;

TEST_CASE("split's parts share one SplitBackward, an unused part gets zeros", "[join]") {
  Tensor x = leaf(rand_tensor({2, 3, 7}, 5));
  std::vector<Tensor> parts = split(x, 3, 2);  // (2, 3, 3), (2, 3, 3), (2, 3, 1)
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].grad_fn() == parts[2].grad_fn());
  CHECK(parts[0].grad_fn()->name() == "SplitBackward");
  CHECK(parts[1].output_nr() == 1);
  // Part 1 takes no part in the loss: its window of x's gradient is 0.
  Tensor loss = sum(add(mul(parts[0], parts[0]), mul(parts[2], 3.0)));
  backward(loss);
  std::vector<double> want(2 * 3 * 7, 0.0), xv = x.to_double_vector();
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 3; ++c) want[r * 7 + c] = 2.0 * xv[r * 7 + c];
    want[r * 7 + 6] = 9.0;  // 3 per element of the (2, 3, 3) sum it is broadcast over
  }
  check_values(x.grad(), want, 0, 0);

  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  Fn f = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> p = split(transpose(in[0], 0, 1), 2, 0);  // a strided input; the last part unused
    return mul(p[0], p[1]);
  };
  check_gradcheck(f, {leaf(rand_tensor({3, 5}, 6))});
}

TEST_CASE("split's backward allocates one input-sized gradient", "[join]") {
  Device d("cpu:5");
  Tensor x = leaf(mg::to(rand_tensor({64, 96}, 7, DType::f32), d));
  std::vector<Tensor> parts = split(x, 32, 1);
  Tensor y = add(add(parts[0], parts[1]), parts[2]);  // (64, 32)
  Tensor loss = sum(y);
  reset_peak_stats(d);
  const int64_t before = memory_stats(d).allocated.current;
  backward(loss);
  // x.grad (64 x 96 floats) and the small transient gradients of add / sum: far below the two
  // extra input-sized tensors a narrow per part made.
  const int64_t grad_bytes = 64 * 96 * 4;
  CHECK(memory_stats(d).allocated.peak - before < grad_bytes + grad_bytes / 2);
  CHECK(x.grad().shape() == Shape{64, 96});
  check_values(x.grad(), std::vector<double>(64 * 96, 1.0), 0, 0);
}

TEST_CASE("split along the last dim writes each row's parts side by side", "[join]") {
  Tensor x = leaf(rand_tensor({4, 5, 9}, 8, DType::f32));
  std::vector<Tensor> parts = split(x, 4, 2);  // widths 4, 4, 1
  Tensor loss = add(add(sum(mul(parts[0], 1.0)), sum(mul(parts[1], parts[1]))), sum(mul(parts[2], 3.0)));
  backward(loss);
  std::vector<double> want, xv = x.to_double_vector();
  for (int64_t r = 0; r < 20; ++r)
    for (int64_t j = 0; j < 9; ++j) want.push_back(j < 4 ? 1.0 : j < 8 ? 2.0 * xv[r * 9 + j] : 3.0);
  check_values(x.grad(), want, 1e-6, 1e-6);
}
