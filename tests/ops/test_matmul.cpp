// matmul and linear: values against hand-computed / naive-loop / PyTorch numbers, NumPy 1-D rules,
// broadcast batch dims, transposed and strided operands, f64 gradcheck (every path: 2-D,
// batched, broadcast, shared-weight flattening, 1-D, linear with bias), f16/bf16 against f32,
// meta shapes, results independent of the thread count, and error messages.
#include <catch2/catch.hpp>

#include "core/parallel.h"
#include "ops/cpu_gemm.h"
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

// Independent reference: a (Ba..., N, K) @ b (Bb..., K, M) by plain loops over the broadcast
// batch (both given with the same number of batch dims, broadcasting sizes of 1).
std::vector<double> naive_bmm(const Tensor& a, const Tensor& b, const Shape& batch) {
  const int64_t N = a.size(-2), K = a.size(-1), M = b.size(-1);
  std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector();
  std::vector<double> out;
  const int64_t nb = numel_of(batch);
  for (int64_t i = 0; i < nb; ++i) {
    int64_t ia = 0, ib = 0, r = i, ma = 1, mb = 1;
    for (size_t d = batch.size(); d-- > 0;) {
      int64_t idx = r % batch[d];
      r /= batch[d];
      int64_t sa = a.shape()[d], sb = b.shape()[d];
      ia += (sa == 1 ? 0 : idx) * ma;
      ib += (sb == 1 ? 0 : idx) * mb;
      ma *= sa;
      mb *= sb;
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[size_t(ia * N * K + n * K + k)] * bv[size_t(ib * K * M + k * M + m)];
        out.push_back(s);
      }
  }
  return out;
}

}  // namespace

TEST_CASE("matmul of 2-D matrices gives hand-computed values", "[matmul]") {
  Tensor a = from_vector({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}, {.dtype = DType::f64});
  Tensor b = from_vector({7.0, 8.0, 9.0, 10.0, 11.0, 12.0}, {3, 2}, {.dtype = DType::f64});
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 2});
  check_values(c, {58, 64, 139, 154}, 0, 0);
  check_values(matmul(cast(a, DType::f32), cast(b, DType::f32)), {58, 64, 139, 154}, 0, 0);
  // Transposed views go to the GEMM as transposed operands: a^T a (3, 3).
  check_values(matmul(transpose(a, 0, 1), a), {17, 22, 27, 22, 29, 36, 27, 36, 45}, 0, 0);
  // A column slice with stride 2 in its last dim has no unit stride: copied, same values.
  Tensor wide = from_vector({1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0, 5.0, 0.0, 6.0, 0.0}, {2, 6}, {.dtype = DType::f64});
  check_values(matmul(slice(wide, 1, 0, 6, 2), b), {58, 64, 139, 154}, 0, 0);
  // K = 0: an empty sum is zero.
  check_values(matmul(zeros({2, 0}), zeros({0, 3})), std::vector<double>(6, 0.0), 0, 0);
  CHECK(std::string(cpu_gemm_backend()).find("Eigen 3.") != std::string::npos);  // f64 (and the f32 option)
}

TEST_CASE("matmul follows NumPy for 1-D operands", "[matmul]") {
  Tensor m = from_vector({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}, {.dtype = DType::f64});
  Tensor v3 = from_vector({1.0, -1.0, 2.0}, {3}, {.dtype = DType::f64});
  Tensor v2 = from_vector({2.0, 0.5}, {2}, {.dtype = DType::f64});
  Tensor mv = matmul(m, v3);  // (2, 3) @ (3) -> (2)
  CHECK(mv.shape() == Shape{2});
  check_values(mv, {5, 11}, 0, 0);
  Tensor vm = matmul(v2, m);  // (2) @ (2, 3) -> (3)
  CHECK(vm.shape() == Shape{3});
  check_values(vm, {4, 6.5, 9}, 0, 0);
  Tensor dot = matmul(v3, v3);  // (3) @ (3) -> ()
  CHECK(dot.dim() == 0);
  CHECK(dot.item() == 6.0);
  Tensor bm = rand_tensor({4, 2, 3}, 3);
  Tensor bv = matmul(bm, v3);  // (4, 2, 3) @ (3) -> (4, 2)
  CHECK(bv.shape() == Shape{4, 2});
  check_close(bv, reshape(matmul(bm, reshape(v3, {3, 1})), {4, 2}), 1e-12, 1e-12);
  Tensor vb = matmul(v2, bm);  // (2) @ (4, 2, 3) -> (4, 3)
  CHECK(vb.shape() == Shape{4, 3});
}

TEST_CASE("batched matmul broadcasts batch dims like a naive loop", "[matmul]") {
  Tensor a = rand_tensor({2, 1, 4, 3}, 1);
  Tensor b = rand_tensor({1, 3, 3, 5}, 2);
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 3, 4, 5});
  check_values(c, naive_bmm(a, b, {2, 3}), 1e-12, 1e-12);
  // Fewer batch dims on one side: (3, 5) is shared by every batch -> the flattened one-GEMM path.
  Tensor x = rand_tensor({2, 3, 4, 3}, 4), w = rand_tensor({3, 5}, 5);
  check_values(matmul(x, w), naive_bmm(reshape(x, {6, 4, 3}), reshape(w, {1, 3, 5}), {6}), 1e-12, 1e-12);
  // The shared operand on the left: (4, 3) @ (2, 3, 5).
  Tensor y = rand_tensor({2, 3, 5}, 6), l = rand_tensor({4, 3}, 7);
  check_values(matmul(l, y), naive_bmm(reshape(l, {1, 4, 3}), y, {2}), 1e-12, 1e-12);
  // A batch-transposed operand (batch stride smaller than the matrix): per-batch offsets.
  Tensor p = rand_tensor({4, 2, 3}, 8);
  Tensor pt = permute(p, {1, 0, 2});  // (2, 4, 3), non-contiguous batch
  check_values(matmul(pt, rand_tensor({3, 2}, 9)), naive_bmm(contiguous(pt), reshape(rand_tensor({3, 2}, 9), {1, 3, 2}), {2}),
               1e-12, 1e-12);
}

TEST_CASE("matmul gradients pass gradcheck on every path", "[matmul]") {
  Fn mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  check_gradcheck(mm, {leaf(rand_tensor({3, 4}, 1)), leaf(rand_tensor({4, 2}, 2))});
  check_gradcheck(mm, {leaf(rand_tensor({2, 1, 3, 4}, 3)), leaf(rand_tensor({3, 4, 2}, 4))});   // broadcast
  check_gradcheck(mm, {leaf(rand_tensor({2, 3, 3, 4}, 5)), leaf(rand_tensor({4, 2}, 6))});      // shared b
  check_gradcheck(mm, {leaf(rand_tensor({3, 4}, 7)), leaf(rand_tensor({2, 4, 2}, 8))});         // shared a
  check_gradcheck(mm, {leaf(rand_tensor({4}, 9)), leaf(rand_tensor({2, 4, 3}, 10))});           // 1-D a
  check_gradcheck(mm, {leaf(rand_tensor({2, 3, 4}, 11)), leaf(rand_tensor({4}, 12))});          // 1-D b
  check_gradcheck(mm, {leaf(rand_tensor({4}, 13)), leaf(rand_tensor({4}, 14))});                // dot
  // Transposed (non-contiguous) inputs, and a gradient for one operand only.
  Tensor at = leaf(rand_tensor({4, 3}, 15));
  check_gradcheck([](const std::vector<Tensor>& in) { return matmul(transpose(in[0], 0, 1), transpose(in[1], 0, 1)); },
                  {at, leaf(rand_tensor({2, 4}, 16))});
  check_gradcheck(mm, {leaf(rand_tensor({3, 4}, 17)), rand_tensor({4, 2}, 18)});
  check_gradcheck(mm, {rand_tensor({2, 3, 4}, 19), leaf(rand_tensor({4, 2}, 20))});
}

TEST_CASE("linear equals PyTorch and a matmul plus bias", "[matmul]") {
  Tensor x = from_vector({0.5, -1.0, 2.0, 1.5, 0.25, -0.75}, {2, 3}, {.dtype = DType::f64});
  Tensor w = from_vector({0.1, 0.2, 0.3, -0.4, 0.5, -0.6}, {2, 3}, {.dtype = DType::f64});
  Tensor b = from_vector({0.01, -0.02}, {2}, {.dtype = DType::f64});
  // torch.nn.functional.linear(x, w, b) in float64 (torch 1.13)
  check_values(linear(x, w, b), {0.45999999999999996, -1.92, -0.01499999999999998, -0.04500000000000011}, 1e-14, 1e-15);
  check_values(linear(x, w), {0.45, -1.9, -0.025, -0.025}, 1e-14, 1e-15);
  // (..., in) with several leading dims, a 1-D input, and a transposed (non-contiguous) weight.
  Tensor x3 = rand_tensor({2, 3, 4}, 1), w3 = rand_tensor({5, 4}, 2), b3 = rand_tensor({5}, 3);
  Tensor y3 = linear(x3, w3, b3);
  CHECK(y3.shape() == Shape{2, 3, 5});
  check_close(y3, add(matmul(x3, transpose(w3, 0, 1)), b3), 1e-12, 1e-12);
  Tensor y1 = linear(rand_tensor({4}, 4), w3, b3);
  CHECK(y1.shape() == Shape{5});
  Tensor wt = transpose(rand_tensor({4, 5}, 5), 0, 1);  // (5, 4) view
  check_close(linear(x3, wt), matmul(x3, contiguous(transpose(wt, 0, 1))), 1e-12, 1e-12);
}

TEST_CASE("linear gradients pass gradcheck", "[matmul]") {
  Fn lin = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  check_gradcheck(lin, {leaf(rand_tensor({2, 3, 4}, 1)), leaf(rand_tensor({5, 4}, 2)), leaf(rand_tensor({5}, 3))});
  check_gradcheck(lin, {leaf(rand_tensor({4}, 4)), leaf(rand_tensor({3, 4}, 5)), leaf(rand_tensor({3}, 6))});
  // No bias; a transposed input and weight; only some inputs needing gradients.
  check_gradcheck([](const std::vector<Tensor>& in) { return linear(transpose(in[0], 0, 1), transpose(in[1], 0, 1)); },
                  {leaf(rand_tensor({4, 3}, 7)), leaf(rand_tensor({4, 2}, 8))});
  check_gradcheck(lin, {rand_tensor({3, 4}, 9), leaf(rand_tensor({2, 4}, 10)), rand_tensor({2}, 11)});
  check_gradcheck(lin, {leaf(rand_tensor({3, 4}, 12)), rand_tensor({2, 4}, 13), leaf(rand_tensor({2}, 14))});
}

TEST_CASE("matmul and linear in f16 and bf16 track f32", "[matmul]") {
  Tensor a = rand_tensor({3, 8, 16}, 1, DType::f32), b = rand_tensor({16, 6}, 2, DType::f32);
  Tensor bias = rand_tensor({6}, 3, DType::f32);
  Tensor ref = matmul(a, b), lref = linear(a, transpose(b, 0, 1), bias);
  for (DType dt : {DType::f16, DType::bf16}) {
    double tol = dt == DType::f16 ? 1e-2 : 6e-2;  // inputs rounded to 11 / 8 bits, sums of 16 terms
    Tensor c = matmul(cast(a, dt), cast(b, dt));
    CHECK(c.dtype() == dt);
    check_close(c, ref, tol, tol);
    Tensor l = linear(cast(a, dt), cast(transpose(b, 0, 1), dt), cast(bias, dt));
    CHECK(l.dtype() == dt);
    check_close(l, lref, tol, tol);
  }
}

TEST_CASE("matmul results do not depend on the thread count", "[matmul]") {
  // Small batched (parallel over batches), one large (threaded GEMM), and the flattened path.
  Tensor a = rand_tensor({16, 20, 24}, 1, DType::f32), b = rand_tensor({16, 24, 12}, 2, DType::f32);
  Tensor big_a = rand_tensor({160, 150}, 3, DType::f32), big_b = rand_tensor({150, 170}, 4, DType::f32);
  Tensor w = rand_tensor({24, 40}, 5, DType::f32);
  int saved = num_threads();
  set_num_threads(1);
  auto one = std::vector<std::vector<double>>{matmul(a, b).to_double_vector(), matmul(big_a, big_b).to_double_vector(),
                                             matmul(a, w).to_double_vector()};
  set_num_threads(2);
  auto two = std::vector<std::vector<double>>{matmul(a, b).to_double_vector(), matmul(big_a, big_b).to_double_vector(),
                                             matmul(a, w).to_double_vector()};
  set_num_threads(saved);
  CHECK(one[0] == two[0]);
  CHECK(one[1] == two[1]);
  CHECK(one[2] == two[2]);
  check_values(matmul(big_a, big_b), naive_bmm(reshape(big_a, {1, 160, 150}), reshape(big_b, {1, 150, 170}), {1}), 1e-4,
               1e-4);
}

TEST_CASE("cpu_gemm tiles give the same bits on 1 and 2 threads, for every layout", "[matmul]") {
  // A library's own threaded GEMM would not: its split of C follows the thread count.
  struct Case {
    int64_t M, N, K;
    Transpose ta, tb;
  };
  const Case cases[] = {{300, 200, 100, Transpose::no, Transpose::no}, {1000, 64, 64, Transpose::no, Transpose::yes},
                        {70, 500, 90, Transpose::yes, Transpose::no},  {130, 90, 300, Transpose::yes, Transpose::yes},
                        {1, 2000, 300, Transpose::no, Transpose::no},  {2000, 1, 300, Transpose::no, Transpose::yes}};
  int saved = num_threads();
  for (const Case& c : cases) {
    INFO("M=" << c.M << " N=" << c.N << " K=" << c.K);
    // Stored operands: A is (M, K) or (K, M), B is (K, N) or (N, K); row-major, tight.
    Tensor a = rand_tensor({c.ta == Transpose::no ? c.M : c.K, c.ta == Transpose::no ? c.K : c.M}, 1, DType::f32);
    Tensor b = rand_tensor({c.tb == Transpose::no ? c.K : c.N, c.tb == Transpose::no ? c.N : c.K}, 2, DType::f32);
    std::vector<std::vector<double>> res;
    for (int n : {1, 2}) {
      set_num_threads(n);
      Tensor out = zeros({c.M, c.N});
      cpu_gemm(c.ta, c.tb, c.M, c.N, c.K, 1.0f, a.data<float>(), a.size(1), b.data<float>(), b.size(1), 0.0f,
               out.data<float>(), c.N);
      res.push_back(out.to_double_vector());
    }
    set_num_threads(saved);
    CHECK(res[0] == res[1]);
    Tensor ref = matmul(cast(c.ta == Transpose::no ? a : transpose(a, 0, 1), DType::f64),
                        cast(c.tb == Transpose::no ? b : transpose(b, 0, 1), DType::f64));
    check_values(ref, res[0], 1e-4, 1e-4);
  }
}

TEST_CASE("matmul and linear on meta give shapes only", "[matmul]") {
  Tensor a = empty({2, 1, 4, 3}, {.device = Device("meta")}), b = empty({5, 3, 6}, {.device = Device("meta")});
  Tensor c = matmul(a, b);
  CHECK(c.is_meta());
  CHECK(c.shape() == Shape{2, 5, 4, 6});
  Tensor x = empty({8, 7, 3}, {.device = Device("meta"), .requires_grad = true});
  Tensor w = empty({9, 3}, {.device = Device("meta"), .requires_grad = true});
  Tensor y = linear(x, w, empty({9}, {.device = Device("meta")}));
  CHECK(y.shape() == Shape{8, 7, 9});
  CHECK(y.grad_fn() != nullptr);
}

TEST_CASE("matmul and linear reject bad input with clear messages", "[matmul]") {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("matmul: inner dimensions differ: (2, 3) vs (4, 5)"));
  CHECK_THROWS_WITH(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})), Catch::Contains("batch dimensions (2,) and (3,) do not broadcast"));
  CHECK_THROWS_WITH(matmul(a, zeros({3, 2}, {.dtype = DType::f64})), Catch::Contains("matmul: dtypes differ, f32 and f64"));
  CHECK_THROWS_WITH(matmul(a, zeros({3, 2}, {.device = Device("cpu:1")})),
                    Catch::Contains("different devices, cpu:0 and cpu:1"));
  CHECK_THROWS_WITH(matmul(zeros({}), a), Catch::Contains("at least 1 dimension"));
  CHECK_THROWS_WITH(matmul(zeros({2, 3}, {.dtype = DType::i64}), zeros({3, 2}, {.dtype = DType::i64})),
                    Catch::Contains("expected a floating tensor"));
  CHECK_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 5})), Catch::Contains("linear: input features 3 do not match the weight's 5"));
  CHECK_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 3}), zeros({3})), Catch::Contains("linear: bias must have shape (4)"));
  CHECK_THROWS_WITH(linear(zeros({2, 3}), zeros({3})), Catch::Contains("linear: weight must have 2 dimensions"));
}
