// embedding (values, gradient with repeated indices, range errors, determinism), dropout (one
// seed reproduces the mask, independent of the thread count, mask mean near 1-p, the stream
// rule offset + i, backward recomputes the mask and saves nothing), and cat / stack / split
// (values, views, gradcheck, errors). f16/bf16 and meta for each.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
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
Tensor ids(const std::vector<double>& v, const Shape& s, DType dt = DType::i64) { return from_vector(v, s, {.dtype = dt}); }
}  // namespace

// ---- embedding ---------------------------------------------------------------------------------

TEST_CASE("embedding picks rows for indices of any shape", "[embedding]") {
  Tensor w = reshape(arange(0, 15, 1, {.dtype = DType::f64}), {5, 3});  // row r = (3r, 3r+1, 3r+2)
  for (DType it : {DType::i64, DType::i32}) {
    Tensor out = embedding(w, ids({0, 4, 2, 0}, {2, 2}, it));
    CHECK(out.shape() == Shape{2, 2, 3});
    check_values(out, {0, 1, 2, 12, 13, 14, 6, 7, 8, 0, 1, 2}, 0, 0);
  }
  CHECK(embedding(w, ids({3}, {})).shape() == Shape{3});  // 0-d index -> one row
  // A transposed (non-contiguous) weight and a strided index tensor.
  Tensor wt = transpose(reshape(arange(0, 15, 1, {.dtype = DType::f64}), {3, 5}), 0, 1);  // (5, 3)
  check_values(embedding(wt, slice(ids({1, 9, 4, 9}, {4}), 0, 0, 4, 2)), {1, 6, 11, 4, 9, 14}, 0, 0);
}

TEST_CASE("embedding gradient sums repeated indices", "[embedding]") {
  Tensor w = leaf(rand_tensor({4, 2}, 1));
  Tensor out = embedding(w, ids({1, 3, 1, 1, 0}, {5}));
  Tensor dout = from_vector({1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0}, {5, 2}, {.dtype = DType::f64});
  backward(out, dout);
  // row 0 <- position 4; row 1 <- positions 0, 2, 3; row 2 <- nothing; row 3 <- position 1.
  check_values(w.grad(), {9, 10, 1 + 5 + 7, 2 + 6 + 8, 0, 0, 3, 4}, 0, 0);
  Fn emb = [](const std::vector<Tensor>& in) { return embedding(in[0], ids({2, 2, 0, 1, 2, 0}, {2, 3})); };
  check_gradcheck(emb, {leaf(rand_tensor({3, 4}, 2))});
  Fn emb_t = [](const std::vector<Tensor>& in) { return embedding(transpose(in[0], 0, 1), ids({1, 1, 3}, {3}, DType::i32)); };
  check_gradcheck(emb_t, {leaf(rand_tensor({2, 4}, 3))});
}

TEST_CASE("embedding gradient does not depend on the thread count", "[embedding]") {
  Generator g(3);
  std::vector<double> idx(20000);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = double(g.bits_at(i) % 50);  // many repeats
  Tensor index = ids(idx, {100, 200});
  Tensor dout = rand_tensor({100, 200, 16}, 4, DType::f32);
  int saved = num_threads();
  std::vector<std::vector<double>> grads;
  for (int n : {1, 2}) {
    set_num_threads(n);
    Tensor w = leaf(zeros({50, 16}));
    backward(embedding(w, index), dout);
    grads.push_back(w.grad().to_double_vector());
  }
  set_num_threads(saved);
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("embedding in f16 and bf16, and on meta", "[embedding]") {
  Tensor w = rand_tensor({6, 4}, 1, DType::f32);
  Tensor index = ids({5, 0, 5}, {3});
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor wd = leaf(cast(w, dt));
    Tensor out = embedding(wd, index);
    CHECK(out.dtype() == dt);
    check_close(out, embedding(cast(wd, DType::f32), index), 0, 0);  // a copy: exact
    backward(out, ones({3, 4}, {.dtype = dt}));
    check_values(select(wd.grad(), 0, 5), {2, 2, 2, 2}, 0, 0);
  }
  Tensor mw = empty({10, 8}, {.device = Device("meta"), .requires_grad = true});
  Tensor mo = embedding(mw, empty({2, 3}, {.dtype = DType::i64, .device = Device("meta")}));
  CHECK(mo.is_meta());
  CHECK(mo.shape() == Shape{2, 3, 8});
}

TEST_CASE("embedding rejects bad input with clear messages", "[embedding]") {
  Tensor w = zeros({5, 3});
  CHECK_THROWS_WITH(embedding(w, ids({1, 5}, {2})),
                    Catch::Contains("embedding: index 5 at position 1 is out of range for a vocabulary of 5 rows"));
  CHECK_THROWS_WITH(embedding(w, ids({-1}, {1}, DType::i32)), Catch::Contains("index -1 at position 0"));
  CHECK_THROWS_WITH(embedding(w, zeros({2})), Catch::Contains("indices must be i64 or i32, got f32"));
  CHECK_THROWS_WITH(embedding(zeros({5}), ids({1}, {1})), Catch::Contains("weight (V, C) must have 2 dimensions"));
  CHECK_THROWS_WITH(embedding(w, from_vector({1.0}, {1}, {.dtype = DType::i64, .device = Device("cpu:1")})),
                    Catch::Contains("different devices, cpu:0 and cpu:1"));
}

// ---- dropout -----------------------------------------------------------------------------------

TEST_CASE("dropout is reproducible for one seed and follows the stream rule", "[dropout]") {
  Tensor x = rand_tensor({7, 13}, 1, DType::f32, 0.5, 1.5);  // never zero
  Generator a(42), b(42), c(43);
  a.advance(3), b.advance(3);  // an offset that is not a multiple of Philox's 4 words
  Tensor ya = dropout(x, 0.25, true, &a), yb = dropout(x, 0.25, true, &b), yc = dropout(x, 0.25, true, &c);
  CHECK(ya.to_double_vector() == yb.to_double_vector());
  CHECK(ya.to_double_vector() != yc.to_double_vector());
  CHECK(a.offset() == 3 + 91);
  // Element i uses stream position offset + i: kept iff uniform >= p, scaled by 1/(1-p).
  std::vector<double> xv = x.to_double_vector(), yv = ya.to_double_vector();
  Generator ref(42);
  for (size_t i = 0; i < xv.size(); ++i) {
    bool keep = ref.uniform_at(3 + i) >= 0.25f;
    CHECK(yv[i] == (keep ? double(float(xv[i] * (1.0f / 0.75f))) : 0.0));
  }
  // The next call continues the stream: a different mask from the same generator.
  CHECK(dropout(x, 0.25, true, &a).to_double_vector() != yv);
}

TEST_CASE("dropout does not depend on the thread count and keeps 1-p", "[dropout]") {
  Tensor x = ones({300000});  // several parallel chunks
  int saved = num_threads();
  std::vector<std::vector<double>> outs;
  for (int n : {1, 2}) {
    set_num_threads(n);
    Generator g(7);
    outs.push_back(dropout(x, 0.3, true, &g).to_double_vector());
  }
  set_num_threads(saved);
  CHECK(outs[0] == outs[1]);
  int64_t kept = 0;
  for (double v : outs[0]) {
    if (v != 0) ++kept;
    CHECK((v == 0 || std::abs(v - 1 / 0.7) < 1e-6));
  }
  CHECK(std::abs(double(kept) / 300000 - 0.7) < 0.005);  // binomial sd is 0.0008
}

TEST_CASE("dropout is the identity when not training or p is 0, and checks p", "[dropout]") {
  Tensor x = rand_tensor({4}, 1, DType::f32);
  Generator g(1);
  CHECK(dropout(x, 0.5, false, &g).is_same(x));
  CHECK(dropout(x, 0.0, true, &g).is_same(x));
  CHECK(g.offset() == 0);  // nothing drawn
  CHECK_THROWS_WITH(dropout(x, 1.0, true, &g), Catch::Contains("dropout: p must be in [0, 1), got 1"));
  CHECK_THROWS_WITH(dropout(x, -0.1, true, &g), Catch::Contains("got -0.1"));
  CHECK_THROWS_WITH(dropout(zeros({2}, {.dtype = DType::i32}), 0.5, true), Catch::Contains("expected a floating tensor"));
  // The default generator is used when none is given, and it advances.
  uint64_t before = default_generator().offset();
  dropout(x, 0.5, true);
  CHECK(default_generator().offset() == before + 4);
}

TEST_CASE("dropout backward recomputes the mask and saves nothing", "[dropout]") {
  Tensor x = leaf(rand_tensor({32, 32}, 1, DType::f32, 0.5, 1.5));  // 4096 bytes
  Tensor dout = rand_tensor({32, 32}, 2, DType::f32);
  auto activation = [] { return memory_stats(kCPU).category(MemoryCategory::activation).current; };
  int64_t before = activation();
  Generator g(11);
  Tensor y = dropout(x, 0.5, true, &g);
  CHECK(activation() - before == 4096);  // the output only: no mask was stored
  backward(y, dout);
  std::vector<double> yv = y.to_double_vector(), gv = x.grad().to_double_vector(), dv = dout.to_double_vector();
  for (size_t i = 0; i < yv.size(); ++i) CHECK(gv[i] == (yv[i] != 0 ? double(float(dv[i] * 2.0f)) : 0.0));
  Fn drop = [](const std::vector<Tensor>& in) {
    Generator gen(3);  // the same mask on every evaluation
    return dropout(transpose(in[0], 0, 1), 0.4, true, &gen);
  };
  check_gradcheck(drop, {leaf(rand_tensor({5, 6}, 3))});
}

TEST_CASE("dropout in f16 and bf16 draws the f32 mask, meta advances the generator", "[dropout]") {
  Tensor x = rand_tensor({64}, 1, DType::f32, 0.5, 1.5);
  Generator g32(5);
  Tensor ref = dropout(x, 0.2, true, &g32);
  for (DType dt : {DType::f16, DType::bf16}) {
    Generator g(5);
    Tensor y = dropout(cast(x, dt), 0.2, true, &g);
    CHECK(y.dtype() == dt);
    check_close(y, ref, dt == DType::f16 ? 2e-3 : 1.6e-2, 0);
  }
  Generator gm(5);
  Tensor m = dropout(empty({3, 5}, {.device = Device("meta")}), 0.2, true, &gm);
  CHECK(m.is_meta());
  CHECK(m.shape() == Shape{3, 5});
  CHECK(gm.offset() == 15);
}

// ---- cat, stack, split -------------------------------------------------------------------------

TEST_CASE("cat joins along any dim and routes gradients back", "[join]") {
  Tensor a = from_vector({1.0, 2.0, 3.0, 4.0}, {2, 2}, {.dtype = DType::f64});
  Tensor b = from_vector({5.0, 6.0}, {1, 2}, {.dtype = DType::f64});
  check_values(cat({a, b}, 0), {1, 2, 3, 4, 5, 6}, 0, 0);
  Tensor c = from_vector({7.0, 8.0}, {2, 1}, {.dtype = DType::f64});
  Tensor ac = cat({a, c}, -1);
  CHECK(ac.shape() == Shape{2, 3});
  check_values(ac, {1, 2, 7, 3, 4, 8}, 0, 0);
  check_values(cat({transpose(a, 0, 1), b}, 0), {1, 3, 2, 4, 5, 6}, 0, 0);  // a strided input
  check_values(cat({a, zeros({0, 2}, {.dtype = DType::f64})}, 0), {1, 2, 3, 4}, 0, 0);
  Fn f = [](const std::vector<Tensor>& in) { return cat({in[0], transpose(in[1], 0, 1), in[0]}, 1); };
  check_gradcheck(f, {leaf(rand_tensor({3, 2}, 1)), leaf(rand_tensor({4, 3}, 2))});
  check_values(cat({cast(a, DType::bf16), cast(b, DType::bf16)}, 0), {1, 2, 3, 4, 5, 6}, 0, 0);
  Tensor m = cat({empty({2, 3}, {.device = Device("meta")}), empty({2, 5}, {.device = Device("meta")})}, 1);
  CHECK(m.is_meta());
  CHECK(m.shape() == Shape{2, 8});
}

TEST_CASE("stack adds a dim and split returns views", "[join]") {
  Tensor a = from_vector({1.0, 2.0, 3.0}, {3}, {.dtype = DType::f64});
  Tensor b = from_vector({4.0, 5.0, 6.0}, {3}, {.dtype = DType::f64});
  Tensor s0 = stack({a, b}, 0), s1 = stack({a, b}, -1);
  CHECK(s0.shape() == Shape{2, 3});
  check_values(s0, {1, 2, 3, 4, 5, 6}, 0, 0);
  CHECK(s1.shape() == Shape{3, 2});
  check_values(s1, {1, 4, 2, 5, 3, 6}, 0, 0);
  Fn st = [](const std::vector<Tensor>& in) { return stack({in[0], in[1]}, 1); };
  check_gradcheck(st, {leaf(rand_tensor({2, 3}, 1)), leaf(rand_tensor({2, 3}, 2))});

  Tensor x = reshape(arange(0, 10, 1, {.dtype = DType::f64}), {5, 2});
  std::vector<Tensor> parts = split(x, 2, 0);
  REQUIRE(parts.size() == 3);
  CHECK(parts[2].shape() == Shape{1, 2});
  for (const Tensor& p : parts) CHECK(p.storage() == x.storage());  // views, no copy
  check_values(parts[1], {4, 5, 6, 7}, 0, 0);
  CHECK(split(x, 5, 1).size() == 1);
  Fn sp = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> p = split(in[0], 2, 1);  // (3, 2), (3, 2), (3, 1)
    return add(mul(p[0], p[1]), p[2]);
  };
  check_gradcheck(sp, {leaf(rand_tensor({3, 5}, 3))});
}

TEST_CASE("cat, stack and split reject bad input with clear messages", "[join]") {
  CHECK_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 4})}, 0),
                    Catch::Contains("cat: tensor 1 has shape (2, 4), expected (2, 3) except along dimension 0"));
  CHECK_THROWS_WITH(cat({zeros({2}), zeros({2}, {.dtype = DType::f64})}, 0), Catch::Contains("cat: dtypes differ"));
  CHECK_THROWS_WITH(cat({zeros({2}), zeros({2}, {.device = Device("cpu:1")})}, 0),
                    Catch::Contains("different devices, cpu:0 and cpu:1"));
  CHECK_THROWS_WITH(cat({}, 0), Catch::Contains("cat: needs at least one tensor"));
  CHECK_THROWS_WITH(cat({zeros({2})}, 1), Catch::Contains("cat"));
  CHECK_THROWS_WITH(stack({zeros({2}), zeros({3})}, 0), Catch::Contains("stack: tensor 1 has shape (3,), expected (2,)"));
  CHECK_THROWS_WITH(split(zeros({4}), 0, 0), Catch::Contains("split: split_size must be positive, got 0"));
}
