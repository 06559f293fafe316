// scaled_dot_product_attention: equals the composition matmul -> scale -> causal mask -> softmax
// -> (dropout) -> matmul built from ops (values and gradients), PyTorch numbers, f64 gradcheck
// with and without dropout and for non-contiguous inputs, a reproducible dropout mask,
// f16/bf16 against f32, thread-count independence, what it keeps in memory, meta, errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::check_close;
using test::check_gradcheck;
using test::check_values;
using test::leaf;
using test::rand_tensor;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// (B, NH, T, T) dropout factors the attention draws: (u >= p) / (1 - p) at positions offset + i.
Tensor drop_factors(const Shape& s, uint64_t seed, uint64_t offset, double p, DType dt) {
  Generator g(seed);
  std::vector<double> m(size_t(numel_of(s)));
  for (size_t i = 0; i < m.size(); ++i) m[i] = g.uniform_at(offset + i) >= float(p) ? 1.0 / (1.0 - p) : 0.0;
  return from_vector(m, s, {.dtype = dt});
}

// The same attention composed from ops.
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor& drop = Tensor()) {
  const int64_t T = q.size(2);
  Tensor s = mul(matmul(q, transpose(k, -2, -1)), 1.0 / std::sqrt(double(q.size(3))));
  if (causal) {
    std::vector<double> above(size_t(T * T));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) above[size_t(i * T + j)] = j > i;
    s = masked_fill(s, from_vector(above, {T, T}, {.dtype = DType::b8}), -std::numeric_limits<double>::infinity());
  }
  Tensor p = softmax(s, -1);
  if (drop.defined()) p = mul(p, drop);
  return matmul(p, v);
}

}  // namespace

TEST_CASE("attention matches PyTorch on a tiny case", "[attention]") {
  std::vector<double> qs, ks, vs;
  for (int i = 0; i < 6; ++i) qs.push_back(std::sin(i)), ks.push_back(std::cos(i)), vs.push_back(i * 0.1 - 0.2);
  Tensor q = from_vector(qs, {1, 1, 3, 2}, {.dtype = DType::f64});
  Tensor k = from_vector(ks, {1, 1, 3, 2}, {.dtype = DType::f64});
  Tensor v = from_vector(vs, {1, 1, 3, 2}, {.dtype = DType::f64});
  // torch: softmax((q @ k^T / sqrt(2)).masked_fill(triu(1), -inf), -1) @ v in float64 (torch 1.13)
  check_values(scaled_dot_product_attention(q, k, v, true),
               {-0.2, -0.1, -0.1486619926613689, -0.04866199266136889, 0.038025539649665985, 0.13802553964966602}, 1e-13,
               1e-14);
  check_values(scaled_dot_product_attention(q, k, v, false),
               {-0.01252853357278215, 0.08747146642721786, -0.07888500879722621, 0.02111499120277379,
                0.038025539649665985, 0.13802553964966602},
               1e-13, 1e-14);
}

TEST_CASE("attention equals the composition of ops, values and gradients", "[attention]") {
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    Tensor q = leaf(rand_tensor({2, 3, 5, 4}, 1)), k = leaf(rand_tensor({2, 3, 5, 4}, 2));
    Tensor v = leaf(rand_tensor({2, 3, 5, 4}, 3));
    Tensor dout = rand_tensor({2, 3, 5, 4}, 4);
    Tensor out = scaled_dot_product_attention(q, k, v, causal);
    backward(out, dout);
    std::vector<Tensor> grads = {q.grad(), k.grad(), v.grad()};
    for (const Tensor& t : {q, k, v}) t.set_grad(Tensor());
    Tensor ref = composed(q, k, v, causal);
    backward(ref, dout);
    check_close(out, ref, 1e-12, 1e-13);
    check_close(grads[0], q.grad(), 1e-10, 1e-12);
    check_close(grads[1], k.grad(), 1e-10, 1e-12);
    check_close(grads[2], v.grad(), 1e-10, 1e-12);
  }
}

TEST_CASE("attention gradients pass gradcheck", "[attention]") {
  Fn causal = [](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], true); };
  Fn full = [](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], false); };
  check_gradcheck(causal, {leaf(rand_tensor({1, 2, 4, 3}, 1)), leaf(rand_tensor({1, 2, 4, 3}, 2)),
                           leaf(rand_tensor({1, 2, 4, 3}, 3))});
  check_gradcheck(full, {leaf(rand_tensor({2, 1, 3, 2}, 4)), leaf(rand_tensor({2, 1, 3, 2}, 5)),
                         leaf(rand_tensor({2, 1, 3, 2}, 6))});
  // As a model calls it: q, k, v are (B, T, NH, HS) tensors transposed to (B, NH, T, HS) views;
  // and only some inputs needing gradients.
  Fn heads = [](const std::vector<Tensor>& in) {
    return scaled_dot_product_attention(transpose(in[0], 1, 2), transpose(in[1], 1, 2), transpose(in[2], 1, 2), true);
  };
  check_gradcheck(heads, {leaf(rand_tensor({1, 4, 2, 3}, 7)), leaf(rand_tensor({1, 4, 2, 3}, 8)),
                          leaf(rand_tensor({1, 4, 2, 3}, 9))});
  check_gradcheck(causal, {leaf(rand_tensor({1, 1, 4, 3}, 10)), rand_tensor({1, 1, 4, 3}, 11), rand_tensor({1, 1, 4, 3}, 12)});
  check_gradcheck(causal, {rand_tensor({1, 1, 4, 3}, 13), leaf(rand_tensor({1, 1, 4, 3}, 14)), rand_tensor({1, 1, 4, 3}, 15)});
  check_gradcheck(causal, {rand_tensor({1, 1, 4, 3}, 16), rand_tensor({1, 1, 4, 3}, 17), leaf(rand_tensor({1, 1, 4, 3}, 18))});
}

TEST_CASE("attention dropout is reproducible and equals a mask on the weights", "[attention]") {
  const Shape s{2, 2, 6, 4};
  Tensor q = leaf(rand_tensor(s, 1)), k = leaf(rand_tensor(s, 2)), v = leaf(rand_tensor(s, 3));
  Generator gen(77);
  gen.advance(5);  // an unaligned start offset
  Tensor out = scaled_dot_product_attention(q, k, v, true, 0.4, &gen);
  CHECK(gen.offset() == 5 + 2 * 2 * 6 * 6);
  Generator again(77);
  again.advance(5);
  CHECK(scaled_dot_product_attention(q, k, v, true, 0.4, &again).to_double_vector() == out.to_double_vector());
  Tensor drop = drop_factors({2, 2, 6, 6}, 77, 5, 0.4, DType::f64);
  Tensor dout = rand_tensor(s, 4);
  backward(out, dout);
  std::vector<Tensor> grads = {q.grad(), k.grad(), v.grad()};
  for (const Tensor& t : {q, k, v}) t.set_grad(Tensor());
  Tensor ref = composed(q, k, v, true, drop);
  backward(ref, dout);
  check_close(out, ref, 1e-12, 1e-13);
  check_close(grads[0], q.grad(), 1e-10, 1e-12);
  check_close(grads[1], k.grad(), 1e-10, 1e-12);
  check_close(grads[2], v.grad(), 1e-10, 1e-12);
  // gradcheck with a fresh generator per call, so every evaluation draws the same mask.
  Fn dropped = [](const std::vector<Tensor>& in) {
    Generator g(5);
    return scaled_dot_product_attention(in[0], in[1], in[2], true, 0.3, &g);
  };
  check_gradcheck(dropped, {leaf(rand_tensor({1, 2, 4, 3}, 5)), leaf(rand_tensor({1, 2, 4, 3}, 6)),
                            leaf(rand_tensor({1, 2, 4, 3}, 7))});
}

TEST_CASE("attention in f16 and bf16 tracks f32", "[attention]") {
  const Shape s{2, 2, 8, 8};
  Tensor q = rand_tensor(s, 1, DType::f32), k = rand_tensor(s, 2, DType::f32), v = rand_tensor(s, 3, DType::f32);
  Tensor dout = rand_tensor(s, 4, DType::f32);
  Tensor qf = leaf(clone(q)), kf = leaf(clone(k)), vf = leaf(clone(v));
  Tensor ref = scaled_dot_product_attention(qf, kf, vf, true);
  backward(ref, dout);
  for (DType dt : {DType::f16, DType::bf16}) {
    double tol = dt == DType::f16 ? 5e-3 : 3e-2;
    Tensor qd = leaf(cast(q, dt)), kd = leaf(cast(k, dt)), vd = leaf(cast(v, dt));
    Tensor out = scaled_dot_product_attention(qd, kd, vd, true);
    CHECK(out.dtype() == dt);
    check_close(out, ref, tol, tol);
    backward(out, cast(dout, dt));
    CHECK(qd.grad().dtype() == dt);
    CHECK(vd.grad().shape() == s);
    check_close(qd.grad(), qf.grad(), 2 * tol, 2 * tol);
    check_close(kd.grad(), kf.grad(), 2 * tol, 2 * tol);
    check_close(vd.grad(), vf.grad(), 2 * tol, 2 * tol);
  }
}

TEST_CASE("attention results do not depend on the thread count", "[attention]") {
  Tensor q = rand_tensor({2, 4, 24, 8}, 1, DType::f32), k = rand_tensor({2, 4, 24, 8}, 2, DType::f32);
  Tensor v = rand_tensor({2, 4, 24, 8}, 3, DType::f32);
  int saved = num_threads();
  std::vector<std::vector<double>> res;
  for (int n : {1, 2}) {
    set_num_threads(n);
    Generator g(9);
    Tensor qq = leaf(clone(q));
    Tensor out = scaled_dot_product_attention(qq, k, v, true, 0.2, &g);
    backward(sum(mul(out, out)));
    res.push_back(out.to_double_vector());
    res.push_back(qq.grad().to_double_vector());
  }
  set_num_threads(saved);
  CHECK(res[0] == res[2]);
  CHECK(res[1] == res[3]);
}

TEST_CASE("attention keeps the weights as an activation only when recording", "[attention]") {
  // (1, 2, 16, 16) f32: out and the weights are 2048 bytes each (multiples of the 512 B rounding).
  Tensor q = rand_tensor({1, 2, 16, 16}, 1, DType::f32), k = rand_tensor({1, 2, 16, 16}, 2, DType::f32);
  Tensor v = rand_tensor({1, 2, 16, 16}, 3, DType::f32), dout = rand_tensor({1, 2, 16, 16}, 4, DType::f32);
  auto activation = [] { return memory_stats(kCPU).category(MemoryCategory::activation).current; };
  int64_t before = activation();
  {
    Tensor out = scaled_dot_product_attention_math(q, k, v, true);  // no graph: weights are scratch
    CHECK(activation() - before == 2048);
  }
  q.set_requires_grad(true);
  {
    Tensor out = scaled_dot_product_attention_math(q, k, v, true);  // out + saved weights
    CHECK(activation() - before == 4096);
    backward(out, dout);
    CHECK(activation() - before == 2048);  // the weights were released right after backward
  }
  q.set_requires_grad(false);
  // The default (flash) path keeps the row log-sum-exp (1, 2, 16) f32 = 128 B (one 512 B block)
  // instead of the weights.
  {
    Tensor out = scaled_dot_product_attention(q, k, v, true);
    CHECK(activation() - before == 2048);
  }
  q.set_requires_grad(true);
  {
    Tensor out = scaled_dot_product_attention(q, k, v, true);
    CHECK(activation() - before == 2048 + 512);
    backward(out, dout);
    CHECK(activation() - before == 2048);
  }
}

TEST_CASE("attention on meta gives the output shape", "[attention]") {
  Tensor q = empty({2, 4, 16, 8}, {.device = Device("meta"), .requires_grad = true});
  Generator g(1);
  Tensor out = scaled_dot_product_attention(q, q, q, true, 0.1, &g);
  CHECK(out.is_meta());
  CHECK(out.shape() == Shape{2, 4, 16, 8});
  CHECK(g.offset() == 2 * 4 * 16 * 16);  // the generator advances exactly as on cpu
}

TEST_CASE("attention rejects bad input with clear messages", "[attention]") {
  Tensor q = zeros({1, 2, 4, 3});
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, zeros({1, 2, 5, 3}), q),
                    Catch::Contains("q, k and v must have one shape (B, NH, T, HS), got (1, 2, 4, 3), (1, 2, 5, 3)"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({2, 4, 3}), zeros({2, 4, 3}), zeros({2, 4, 3})),
                    Catch::Contains("q (B, NH, T, HS) must have 4 dimensions"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, zeros({1, 2, 4, 3}, {.dtype = DType::f64}), q),
                    Catch::Contains("dtypes differ, f32 and f64"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, zeros({1, 2, 4, 3}, {.device = Device("cpu:1")})),
                    Catch::Contains("different devices, cpu:0 and cpu:1"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, true, 1.0), Catch::Contains("dropout_p must be in [0, 1), got 1"));
}
