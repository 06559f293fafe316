// The bitmask sparse x dense GEMM (ops/sparse_gemm.h): every path this CPU has gives the same bits
// as the scalar reference and matches the dense linear op on the same weights (zeros included)
// at sparsities 0 to 100%, for M below, at and past the 64-column register tile and K that is not
// a multiple of 8 (rows that start mid-byte in the bitmask); bad operands are clear errors. The 2:4
// kernel likewise, for row counts around its 8- and 4-row blocks and odd group counts.
#include <catch2/catch.hpp>

#include <cstdio>

#include "autograd/grad_mode.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"
#include "ops/ops.h"
#include "ops/sparse_gemm.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;

namespace {

// A (N, K) f32 weight with about `sparsity` of its entries zero (seeded).
Tensor sparse_weight(int64_t N, int64_t K, double sparsity, uint64_t seed) {
  Tensor w = rand_tensor({N, K}, seed, DType::f32);
  Tensor keep = rand_tensor({N, K}, seed + 1, DType::f64, 0.0, 1.0);
  float* p = w.data<float>();
  const double* u = keep.data<double>();
  for (int64_t i = 0; i < N * K; ++i)
    if (u[i] < sparsity) p[i] = 0.0f;
  return w;
}

}  // namespace

TEST_CASE("sparse gemm: every path equals the scalar reference and the dense linear", "[prune][sparse]") {
  const int64_t N = 37, K = GENERATE(70, 64, 1);
  const double sparsity = GENERATE(0.0, 0.5, 0.9, 1.0);
  const int64_t M = GENERATE(1, 16, 100, 130);
  Tensor w = sparse_weight(N, K, sparsity, 11 + uint64_t(K));
  Tensor b = rand_tensor({N}, 5, DType::f32);
  Tensor x = rand_tensor({M, K}, 7, DType::f32);
  BitmaskSparse s = to_bitmask_sparse(w);
  Tensor off = bitmask_row_offsets(s.bits, N, K);
  CHECK(off.data<int64_t>()[N] == s.values.numel());
  NoGradGuard no_grad;
  const Tensor ref = bitmask_linear(x, s.bits, s.values, off, N, b, SparseGemmPath::scalar);
  std::string why;
  CHECK(all_close(ref.to_double_vector(), linear(x, w, b).to_double_vector(), 1e-5, 1e-5, &why));
  INFO(why);
  for (SparseGemmPath path : {SparseGemmPath::avx2, SparseGemmPath::avx512}) {
    if (!sparse_gemm_path_supported(path)) {
      std::printf("skipped: this CPU has no %s path\n", sparse_gemm_path_name(path));
      continue;
    }
    CHECK(bitmask_linear(x, s.bits, s.values, off, N, b, path).to_double_vector() == ref.to_double_vector());
  }
  // Batched input (B, T, K) and no bias, on the best path.
  Tensor x3 = rand_tensor({2, 3, K}, 9, DType::f32);
  const Tensor y3 = bitmask_linear(x3, s.bits, s.values, off, N);
  CHECK(y3.shape() == Shape{2, 3, N});
  CHECK(all_close(y3.to_double_vector(), linear(x3, w).to_double_vector(), 1e-5, 1e-5));
}

TEST_CASE("sparse gemm: the best path is one this CPU runs, bad operands are clear errors", "[prune][sparse]") {
  CHECK(sparse_gemm_path_supported(sparse_gemm_best_path()));
  CHECK(sparse_gemm_path_supported(SparseGemmPath::scalar));
  std::printf("sparse gemm path on this CPU: %s\n", sparse_gemm_path_name(sparse_gemm_best_path()));
  Tensor w = sparse_weight(8, 12, 0.5, 3);
  BitmaskSparse s = to_bitmask_sparse(w);
  Tensor off = bitmask_row_offsets(s.bits, 8, 12);
  Tensor x = rand_tensor({4, 12}, 1, DType::f32);
  NoGradGuard no_grad;
  CHECK_THROWS_WITH(bitmask_linear(rand_tensor({4, 12}, 1, DType::f64), s.bits, s.values, off, 8),
                    Catch::Contains("expected an f32 cpu input"));
  CHECK_THROWS_WITH(bitmask_linear(rand_tensor({4, 13}, 1, DType::f32), s.bits, s.values, off, 8),
                    Catch::Contains("bytes for a (8, 13) weight"));
  CHECK_THROWS_WITH(bitmask_linear(x, s.bits, slice(s.values, 0, 0, s.values.numel() - 1), off, 8),
                    Catch::Contains("nonzeros, the values tensor holds"));
  CHECK_THROWS_WITH(bitmask_linear(x, s.bits, s.values, off, 8, rand_tensor({7}, 1, DType::f32)),
                    Catch::Contains("bias must be (8)"));
  CHECK_THROWS_WITH(bitmask_linear(x, s.bits, s.values, slice(off, 0, 0, 8), 8), Catch::Contains("row_offsets must be (9)"));
  CHECK_THROWS_WITH(bitmask_row_offsets(s.bits, 8, 13), Catch::Contains("cannot hold a (8, 13) matrix"));
  {
    EnableGradGuard grad;
    CHECK_THROWS_WITH(bitmask_linear(leaf(x), s.bits, s.values, off, 8), Catch::Contains("inference only"));
  }
}

TEST_CASE("sparse gemm 2:4: every path equals the scalar reference and the dense linear", "[prune][sparse24]") {
  const int64_t N = GENERATE(1, 37);  // 37: blocks of 8 (AVX-512) and 4 (AVX2) rows plus the rest
  const int64_t K = GENERATE(4, 12, 64);
  const int64_t M = GENERATE(1, 16, 100);
  Tensor w = rand_tensor({N, K}, 21 + uint64_t(K), DType::f32);
  prune_24_(w);
  const Sparse24 s = to_sparse_24(w);
  Tensor b = rand_tensor({N}, 5, DType::f32);
  Tensor x = rand_tensor({M, K}, 7, DType::f32);
  NoGradGuard no_grad;
  const Tensor ref = sparse24_linear(x, s.values, s.meta, N, b, SparseGemmPath::scalar);
  std::string why;
  CHECK(all_close(ref.to_double_vector(), linear(x, w, b).to_double_vector(), 1e-5, 1e-5, &why));
  INFO(why);
  for (SparseGemmPath path : {SparseGemmPath::avx2, SparseGemmPath::avx512}) {
    if (!sparse_gemm_path_supported(path)) {
      std::printf("skipped: this CPU has no %s path\n", sparse_gemm_path_name(path));
      continue;
    }
    CHECK(sparse24_linear(x, s.values, s.meta, N, b, path).to_double_vector() == ref.to_double_vector());
  }
  Tensor x3 = rand_tensor({2, 3, K}, 9, DType::f32);  // batched, no bias, the best path
  const Tensor y3 = sparse24_linear(x3, s.values, s.meta, N);
  CHECK(y3.shape() == Shape{2, 3, N});
  CHECK(all_close(y3.to_double_vector(), linear(x3, w).to_double_vector(), 1e-5, 1e-5));
}

TEST_CASE("sparse gemm 2:4: bad operands are clear errors", "[prune][sparse24]") {
  Tensor w = rand_tensor({8, 16}, 3, DType::f32);
  prune_24_(w);
  const Sparse24 s = to_sparse_24(w);
  Tensor x = rand_tensor({4, 16}, 1, DType::f32);
  NoGradGuard no_grad;
  CHECK_THROWS_WITH(sparse24_linear(rand_tensor({4, 14}, 1, DType::f32), s.values, s.meta, 8),
                    Catch::Contains("multiple of 4, got 14"));
  CHECK_THROWS_WITH(sparse24_linear(rand_tensor({4, 12}, 1, DType::f32), s.values, s.meta, 8),
                    Catch::Contains("are (8, 6) contiguous f32"));
  CHECK_THROWS_WITH(sparse24_linear(x, s.values, slice(s.meta, 0, 0, 7), 8), Catch::Contains("is (8, 2) contiguous u8"));
  CHECK_THROWS_WITH(sparse24_linear(x, s.values, s.meta, 8, rand_tensor({7}, 1, DType::f32)),
                    Catch::Contains("bias must be (8)"));
  CHECK_THROWS_WITH(sparse24_linear(rand_tensor({4, 16}, 1, DType::f64), s.values, s.meta, 8),
                    Catch::Contains("expected an f32 cpu input"));
  EnableGradGuard grad;
  CHECK_THROWS_WITH(sparse24_linear(leaf(x), s.values, s.meta, 8), Catch::Contains("inference only"));
}
