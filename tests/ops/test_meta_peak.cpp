// The meta device predicts memory exactly: a model's forward and backward on meta allocate the
// same bytes, in the same order, as on a real device, so the allocator's peak is identical.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;

namespace {

// A small transformer-ish MLP block stack with a convolutional stem, run on `d`; returns the
// peak allocated bytes of one forward + backward.
int64_t step_peak(Device d) {
  Tensor w_conv, w1, b1, w2, b2, ln_w, ln_b, bn_mean, bn_var, bn_w, bn_b;
  {
    MemoryCategoryGuard tag(MemoryCategory::parameter);
    auto p = [&](Shape s, uint64_t seed) { return test::leaf(test::rand_tensor(s, seed, DType::f32, -0.5, 0.5, d)); };
    w_conv = p({8, 3, 3, 3}, 1);
    bn_w = p({8}, 2);
    bn_b = p({8}, 3);
    bn_mean = zeros({8}, {.device = d});
    bn_var = ones({8}, {.device = d});
    w1 = p({64, 128}, 4);
    b1 = p({64}, 5);
    ln_w = p({64}, 6);
    ln_b = p({64}, 7);
    w2 = p({10, 64}, 8);
    b2 = p({10}, 9);
  }
  Tensor x, target;
  {
    MemoryCategoryGuard tag(MemoryCategory::input);
    x = test::rand_tensor({4, 3, 8, 8}, 10, DType::f32, -1, 1, d);
    target = zeros({4}, {.dtype = DType::i64, .device = d});
  }
  reset_peak_stats(d);
  Tensor h = conv2d(x, w_conv, Tensor(), {.stride = 2, .padding = 1});          // (4, 8, 4, 4)
  h = relu6(batch_norm(h, bn_mean, bn_var, bn_w, bn_b, true));
  h = reshape(h, {4, 128});
  h = gelu_tanh(layer_norm(linear(h, w1, b1), ln_w, ln_b));                    // (4, 64)
  Tensor logits = linear(h, w2, b2);                                           // (4, 10)
  Tensor loss = cross_entropy(logits, target);
  backward(loss);
  return memory_stats(d).allocated.peak;
}

}  // namespace

TEST_CASE("forward and backward on meta give the same peak as on cpu", "[meta]") {
  int64_t cpu_peak = step_peak(Device("cpu:10"));
  int64_t meta_peak = step_peak(kMeta);
  CHECK(cpu_peak > 0);
  CHECK(meta_peak == cpu_peak);
}
