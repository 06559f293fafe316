// The default (flash) attention path against the materialised reference: values and gradients
// within 1e-5 in f32 (1e-12 in f64) for tile-straddling lengths, with dropout, on model-style
// strided views; the exact set of tensors it saves; its memory at T = 1024 and 2048 against the
// reference's (at least 10x lower); the same peak on meta and for any thread count.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/saved_tensor.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::check_close;
using test::leaf;
using test::rand_tensor;

namespace {

using Attn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, bool, double, Generator*);

struct Result {
  Tensor out, dq, dk, dv;
};

// q, k, v as a model makes them: (B, T, NH, HS) leaves viewed as (B, NH, T, HS).
Result run(Attn fn, const Shape& bthd, DType dt, bool causal, double p, uint64_t seed) {
  Tensor q = leaf(rand_tensor(bthd, seed, dt)), k = leaf(rand_tensor(bthd, seed + 1, dt));
  Tensor v = leaf(rand_tensor(bthd, seed + 2, dt));
  Generator g(123);
  g.advance(7);
  Tensor out = fn(transpose(q, 1, 2), transpose(k, 1, 2), transpose(v, 1, 2), causal, p, &g);
  Tensor dout = rand_tensor(out.shape(), seed + 3, dt);
  backward(out, dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// Bytes of (B, NH, T, HS) f32 rounded to the allocator's 512 B.
int64_t bytes_of(int64_t n) { return (n * 4 + 511) / 512 * 512; }

// Peak bytes one forward + backward adds beyond its inputs, output and gradients.
int64_t own_peak(Attn fn, int64_t B, int64_t NH, int64_t T, int64_t HS, Device dev) {
  const Shape s{B, NH, T, HS};
  Tensor q = leaf(empty(s, {.device = dev})), k = leaf(empty(s, {.device = dev})), v = leaf(empty(s, {.device = dev}));
  Tensor dout = empty(s, {.device = dev});
  for (const Tensor& t : {q, k, v, dout})
    if (!t.is_meta()) fill_(t, 0.25);
  const int64_t base = memory_stats(dev).allocated.current;
  reset_peak_stats(dev);
  {
    Tensor out = fn(q, k, v, true, 0.0, nullptr);
    backward(out, dout);
  }
  const int64_t peak = memory_stats(dev).allocated.peak - base;
  return peak - 4 * bytes_of(B * NH * T * HS);  // out, dq, dk, dv
}

}  // namespace

TEST_CASE("flash attention equals the materialised path in f32 and f64", "[attention][flash]") {
  for (int64_t T : {1, 63, 64, 65, 130}) {
    for (bool causal : {true, false}) {
      for (double p : {0.0, 0.3}) {
        INFO("T " << T << " causal " << causal << " dropout " << p);
        const Shape s{2, T, 3, 16};
        Result a = run(scaled_dot_product_attention, s, DType::f32, causal, p, 10);
        Result b = run(scaled_dot_product_attention_math, s, DType::f32, causal, p, 10);
        check_close(a.out, b.out, 1e-5, 1e-6);
        check_close(a.dq, b.dq, 1e-5, 1e-6);
        check_close(a.dk, b.dk, 1e-5, 1e-6);
        check_close(a.dv, b.dv, 1e-5, 1e-6);
        Result c = run(scaled_dot_product_attention, s, DType::f64, causal, p, 20);
        Result d = run(scaled_dot_product_attention_math, s, DType::f64, causal, p, 20);
        check_close(c.out, d.out, 1e-12, 1e-13);
        check_close(c.dq, d.dq, 1e-11, 1e-12);
        check_close(c.dk, d.dk, 1e-11, 1e-12);
        check_close(c.dv, d.dv, 1e-11, 1e-12);
      }
    }
  }
}

TEST_CASE("flash attention with head size 64 over several tiles matches in f32", "[attention][flash]") {
  const Shape s{1, 200, 2, 64};
  Result a = run(scaled_dot_product_attention, s, DType::f32, true, 0.1, 30);
  Result b = run(scaled_dot_product_attention_math, s, DType::f32, true, 0.1, 30);
  check_close(a.out, b.out, 1e-5, 1e-6);
  check_close(a.dq, b.dq, 1e-5, 1e-6);
  check_close(a.dk, b.dk, 1e-5, 1e-6);
  check_close(a.dv, b.dv, 1e-5, 1e-6);
}

TEST_CASE("flash attention computes only the gradients asked for", "[attention][flash]") {
  const Shape s{1, 2, 70, 8};
  Tensor q = rand_tensor(s, 1), k = leaf(rand_tensor(s, 2)), v = rand_tensor(s, 3);
  Tensor dout = rand_tensor(s, 4);
  backward(scaled_dot_product_attention(q, k, v, true), dout);
  Tensor k2 = leaf(clone(k.detach()));
  backward(scaled_dot_product_attention_math(q, k2, v, true), dout);
  check_close(k.grad(), k2.grad(), 1e-12, 1e-13);
  CHECK_FALSE(q.grad().defined());
}

TEST_CASE("flash attention saves q, k, v, the output and the row log-sum-exp, nothing (T, T)", "[attention][flash]") {
  std::vector<Shape> saved;
  const Shape s{2, 3, 40, 8};
  Tensor q = leaf(rand_tensor(s, 1, DType::f32)), k = leaf(rand_tensor(s, 2, DType::f32));
  Tensor v = leaf(rand_tensor(s, 3, DType::f32));
  Tensor out;
  {
    SavedTensorHooksGuard hooks({.pack = [&](const Tensor& t) -> std::any {
                                   saved.push_back(t.shape());
                                   return t;
                                 },
                                 .unpack = [](const std::any& a) { return std::any_cast<Tensor>(a); }});
    out = scaled_dot_product_attention(q, k, v, true);
  }
  CHECK(saved == std::vector<Shape>{s, s, s, s, Shape{2, 3, 40}});
  // The output is laid out (B, T, NH, HS): merging the heads is a view.
  CHECK(transpose(out, 1, 2).is_contiguous());
}

TEST_CASE("flash attention's own memory at T = 1024 and 2048 is at least 10x below the math path's",
          "[attention][flash]") {
  const Device dev("cpu:11");
  for (int64_t T : {1024, 2048}) {
    INFO("T " << T);
    const int64_t flash = own_peak(scaled_dot_product_attention, 1, 2, T, 32, dev);
    const int64_t math = own_peak(scaled_dot_product_attention_math, 1, 2, T, 32, dev);
    CHECK(flash > 0);
    CHECK(math >= 2 * bytes_of(2 * T * T));  // the weights, and the same again as scratch in backward
    CHECK(flash * 10 <= math);
    CHECK(flash < bytes_of(2 * T * T) / 8);  // nothing close to one (B, NH, T, T) tensor
  }
}

TEST_CASE("flash attention's peak is the same on meta and for any thread count", "[attention][flash][meta]") {
  const int64_t meta = own_peak(scaled_dot_product_attention, 2, 4, 200, 16, kMeta);
  const int saved = num_threads();
  for (int n : {1, 2, 3}) {
    INFO("threads " << n);
    set_num_threads(n);
    CHECK(own_peak(scaled_dot_product_attention, 2, 4, 200, 16, Device("cpu:12")) == meta);
  }
  set_num_threads(saved);
}
