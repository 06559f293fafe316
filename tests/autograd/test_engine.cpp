// The backward engine: gradients of simple graphs, accumulation across backward calls,
// saved tensors freed as backward runs (activation memory falls), the in-place error,
// retain_graph, non-scalar roots, no_grad, detach, grad-ready hooks and saved-tensor hooks.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::leaf;
using test::rand_tensor;

TEST_CASE("backward computes gradients of a small graph", "[engine]") {
  Tensor x = leaf(from_vector(std::vector<double>{1, 2, 3}, {3}, {.dtype = DType::f64}));
  Tensor y = leaf(from_vector(std::vector<double>{4, 5, 6}, {3}, {.dtype = DType::f64}));
  Tensor z = sum(add(mul(x, y), mul(x, x)));  // d/dx = y + 2x, d/dy = x
  backward(z);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{6, 9, 12});
  CHECK(y.grad().to_vector<double>() == std::vector<double>{1, 2, 3});
}

TEST_CASE("gradients accumulate across two backward calls", "[engine]") {
  Tensor x = leaf(from_vector(std::vector<double>{1, 2}, {2}, {.dtype = DType::f64}));
  backward(sum(mul(x, 3.0)));
  backward(sum(mul(x, x)));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3 + 2, 3 + 4});
}

TEST_CASE("a graph without retain_graph cannot run backward twice", "[engine]") {
  Tensor x = leaf(rand_tensor({3}, 1));
  Tensor y = sum(mul(x, x));
  backward(y, Tensor(), {.retain_graph = true});
  backward(y);  // second run allowed: the graph was retained
  CHECK_THROWS_WITH(backward(y), Catch::Contains("already freed") && Catch::Contains("retain_graph"));
}

TEST_CASE("saved tensors are released while backward runs", "[engine]") {
  Device d("cpu:9");
  Tensor x;
  {
    MemoryCategoryGuard tag(MemoryCategory::parameter);
    x = leaf(rand_tensor({64, 64}, 2, DType::f32, -1, 1, d));
  }
  // A chain of tanh: each node saves its 16 KiB output.
  Tensor h = x;
  for (int i = 0; i < 8; ++i) h = tanh(h);
  Tensor loss = sum(h);
  int64_t act_after_forward = memory_stats(d).category(MemoryCategory::activation).current;
  // Record the activation bytes at each activation free during backward (allocator observer).
  struct Watch : AllocatorObserver {
    Device dev;
    std::vector<int64_t> act;
    void on_event(const MemoryEvent& e) override {
      if (e.device == dev && e.kind == MemoryEvent::Kind::free && e.category == MemoryCategory::activation)
        act.push_back(memory_stats(dev).category(MemoryCategory::activation).current);
    }
  } watch;
  watch.dev = d;
  add_allocator_observer(&watch);
  backward(loss);
  remove_allocator_observer(&watch);
  REQUIRE(watch.act.size() >= 7);
  // Activation memory falls step by step during backward, not all at once at the end.
  for (size_t i = 1; i < watch.act.size(); ++i) CHECK(watch.act[i] < watch.act[i - 1]);
  CHECK(watch.act.front() < act_after_forward);
  // What remains is the last output and the loss, which we still hold.
  h = Tensor();
  loss = Tensor();
  CHECK(memory_stats(d).category(MemoryCategory::activation).current == 0);
}

TEST_CASE("modifying a saved tensor in place is an error at backward naming the op", "[engine]") {
  Tensor x = leaf(rand_tensor({4}, 3));
  Tensor y = exp(x);  // ExpBackward saves y
  Tensor z = sum(y);
  fill_(y, 0.0);  // in-place write bumps y's version
  CHECK_THROWS_WITH(backward(z), Catch::Contains("ExpBackward") && Catch::Contains("modified in place"));
}

TEST_CASE("non-scalar backward takes a gradient of the output's shape", "[engine]") {
  Tensor x = leaf(from_vector(std::vector<double>{1, 2, 3}, {3}, {.dtype = DType::f64}));
  Tensor y = mul(x, x);
  CHECK_THROWS_WITH(backward(y), Catch::Contains("one-element"));
  backward(y, from_vector(std::vector<double>{1, 0.5, 2}, {3}, {.dtype = DType::f64}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 12});
}

TEST_CASE("no_grad records nothing and detach cuts the graph", "[engine]") {
  Tensor x = leaf(rand_tensor({3}, 4));
  {
    NoGradGuard ng;
    Tensor y = mul(x, 2.0);
    CHECK(!y.requires_grad());
  }
  Tensor d = x.detach();
  CHECK(!d.requires_grad());
  CHECK(d.storage() == x.storage());
  Tensor y = add(mul(d, 2.0), x);
  backward(sum(y));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1, 1});
  CHECK_THROWS_WITH(backward(sum(mul(d, 2.0))), Catch::Contains("does not require grad"));
}

TEST_CASE("grad-ready hooks fire once per leaf with the complete gradient", "[engine]") {
  Tensor x = leaf(from_vector(std::vector<double>{1, 2}, {2}, {.dtype = DType::f64}));
  int calls = 0;
  std::vector<double> seen;
  x.add_grad_ready_hook([&](const Tensor& g) {
    ++calls;
    seen = g.to_vector<double>();
  });
  // x is used twice: the hook must wait for both contributions.
  backward(sum(add(mul(x, 2.0), mul(x, x))));
  CHECK(calls == 1);
  CHECK(seen == std::vector<double>{4, 6});
}

TEST_CASE("saved-tensor hooks pack and unpack saved tensors", "[engine]") {
  int packed = 0, unpacked = 0;
  Tensor x = leaf(rand_tensor({5}, 5));
  Tensor loss;
  {
    SavedTensorHooksGuard hooks({[&](const Tensor& t) -> std::any {
                                   ++packed;
                                   return to(t, Device("cpu:1"));  // an offload to another pool
                                 },
                                 [&](const std::any& a) {
                                   ++unpacked;
                                   return to(std::any_cast<Tensor>(a), kCPU);
                                 }});
    loss = sum(tanh(x));
  }
  backward(loss);
  CHECK(packed == 1);
  CHECK(unpacked == 1);
  Tensor expected = rsub(1.0, mul(tanh(x.detach()), tanh(x.detach())));
  test::check_close(x.grad(), expected, 1e-12, 1e-12);
}
