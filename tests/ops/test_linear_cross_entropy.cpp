// linear_cross_entropy (the LM head fused with its loss): the loss and both gradients equal
// cross_entropy(linear(h, w), t) (f32 within 1e-6, f64 within 1e-12) across chunk boundaries and
// with ignored rows; f64 gradcheck; the (N, V) logits never whole (its peak against the unfused
// one's); meta gives the CPU peak; a GPT's loss equals the unfused head's; bad input.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::check_close;
using test::leaf;
using test::rand_tensor;

namespace {

Tensor targets(int64_t N, int64_t V, uint64_t seed, int64_t ignore_every = 0) {
  std::vector<double> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i)
    t[size_t(i)] = ignore_every > 0 && i % ignore_every == 0 ? -100.0 : double((i * 37 + int64_t(seed)) % V);
  return from_vector(t, {N}, {.dtype = DType::i64});
}

struct Grads {
  double loss;
  Tensor dh, dw;
};

Grads run(bool fused, const Tensor& h0, const Tensor& w0, const Tensor& t) {
  Tensor h = leaf(clone(h0)), w = leaf(clone(w0));
  Tensor loss = fused ? linear_cross_entropy(h, w, t) : cross_entropy(linear(h, w), t);
  backward(mul(loss, 1.7));  // a non-unit incoming gradient
  return {loss.item_double(), h.grad(), w.grad()};
}

}  // namespace

TEST_CASE("linear_cross_entropy equals cross_entropy(linear(...)) over several chunks", "[loss]") {
  // V = 5000: 209 rows per chunk, so N = 500 takes three chunks, the last partial.
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dt);
    const int64_t N = 500, C = 24, V = 5000;
    Tensor h = rand_tensor({N, C}, 1, dt), w = rand_tensor({V, C}, 2, dt, -0.3, 0.3);
    Tensor t = targets(N, V, 3, 7);
    Grads a = run(true, h, w, t), b = run(false, h, w, t);
    const double tol = dt == DType::f32 ? 1e-6 : 1e-12;
    CHECK(std::abs(a.loss - b.loss) <= tol * std::abs(b.loss));
    check_close(a.dh, b.dh, dt == DType::f32 ? 1e-4 : 1e-11, 1e-9);
    check_close(a.dw, b.dw, dt == DType::f32 ? 1e-4 : 1e-11, 1e-9);
  }
}

TEST_CASE("linear_cross_entropy passes gradcheck", "[loss]") {
  test::check_gradcheck(
      [](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], targets(5, 7, 1, 4)); },
      {leaf(rand_tensor({5, 3}, 1)), leaf(rand_tensor({7, 3}, 2))});
}

TEST_CASE("linear_cross_entropy never holds the logits whole, meta gives the same peak", "[loss][meta]") {
  const int64_t N = 2048, C = 16, V = 4096;  // logits 32 MiB; a chunk is 256 rows, 4 MiB
  auto peak = [&](bool fused, Device dev) {
    Tensor h = leaf(empty({N, C}, {.device = dev})), w = leaf(empty({V, C}, {.device = dev}));
    Tensor t = empty({N}, {.dtype = DType::i64, .device = dev});
    if (!dev.is_meta()) {
      copy_(h, rand_tensor({N, C}, 1, DType::f32));
      copy_(w, rand_tensor({V, C}, 2, DType::f32));
      copy_(t, targets(N, V, 3));
    }
    const int64_t base = memory_stats(dev).allocated.current;
    reset_peak_stats(dev);
    Tensor loss = fused ? linear_cross_entropy(h, w, t) : cross_entropy(linear(h, w), t);
    backward(loss);
    return memory_stats(dev).allocated.peak - base;
  };
  const int64_t fused = peak(true, Device("cpu:11")), plain = peak(false, Device("cpu:11"));
  const int64_t logits = N * V * 4;
  INFO("fused " << fused << " plain " << plain);
  CHECK(plain >= 2 * logits);                        // logits and their gradient
  CHECK(fused < logits / 2);                         // two 4 MiB chunks and the (small) gradients
  CHECK(fused == peak(true, kMeta));
}

TEST_CASE("GPT's loss through the fused head equals the unfused head's", "[loss][gpt]") {
  GPTConfig cfg{.vocab_size = 300, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 16};  // padded to 384
  GPT model(cfg);
  Tensor idx = targets(2 * 16, 300, 5), y = targets(2 * 16, 300, 9);
  idx = reshape(idx, {2, 16}), y = reshape(y, {2, 16});
  Tensor hidden = model.forward_hidden(idx);
  Tensor fused = model.loss_from_hidden(hidden, y);
  Tensor plain = cross_entropy(reshape(model.forward(idx), {32, 300}), reshape(y, {32}));
  CHECK(std::abs(fused.item_double() - plain.item_double()) <= 1e-6 * std::abs(plain.item_double()));
  backward(fused);
  CHECK(model.wte->weight.grad().defined());
}

TEST_CASE("linear_cross_entropy rejects bad input with clear messages", "[loss]") {
  Tensor h = zeros({4, 3}), w = zeros({5, 3});
  CHECK_THROWS_WITH(linear_cross_entropy(h, zeros({5, 2}), targets(4, 5, 0)),
                    Catch::Contains("expected hidden (N, C) and weight (V, C), got (4, 3) and (5, 2)"));
  CHECK_THROWS_WITH(linear_cross_entropy(h, w, targets(3, 5, 0)), Catch::Contains("target must have shape (N) = (4,), got (3,)"));
  CHECK_THROWS_WITH(linear_cross_entropy(h, w, from_vector({0, 1, 9, 2}, {4}, {.dtype = DType::i64})),
                    Catch::Contains("target 9 at position 2 is out of range [0, 5)"));
  CHECK_THROWS_WITH(linear_cross_entropy(cast(h, DType::bf16), cast(w, DType::bf16), targets(4, 5, 0)),
                    Catch::Contains("expected f32 or f64, got bf16"));
}
