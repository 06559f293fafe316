// Sparse x dense GEMM for pruned inference. Unstructured pruning stores a weight W (N, K) as a
// bitmask (bit n*K + k, LSB first in each byte, says W[n][k] != 0) plus its nonzeros packed row by
// row (models/compress/sparse_format.h), 1/8 byte + 4 (1-s) bytes an element instead of 4. This op
// computes y (M, N) = x (M, K) W^T + b straight from that layout: nnz * M multiply-adds instead of
// N * K * M, so it beats the dense GEMM once enough weights are zero (bench/bench_sparse_gemm.cpp
// prints the sparsity where it does on this machine). The kernel forms Y^T = W X^T: for a tile of
// 64 (or 16) columns of X^T (rows of x) held in vector registers, each nonzero w = W[n][k], found
// by scanning the bitmask with count-trailing-zeros, adds w * X^T[k, tile] (one FMA a register).
// Paths chosen at runtime from cpuid: AVX-512F (4 zmm), AVX2+FMA (8 ymm), and the scalar
// reference; all add in ascending k with a fused multiply-add, so all give the same bits.
#pragma once
#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace mg {

enum class SparseGemmPath { scalar, avx2, avx512 };
const char* sparse_gemm_path_name(SparseGemmPath p);  // "scalar", "AVX2+FMA", "AVX-512F"
bool sparse_gemm_path_supported(SparseGemmPath p);    // by this CPU (cpuid)
SparseGemmPath sparse_gemm_best_path();               // AVX-512F, else AVX2+FMA, else scalar

// (rows + 1) i64: row n's nonzeros are values[offsets[n] .. offsets[n + 1]). bits: cpu u8 of at
// least ceil(rows * cols / 8) bytes.
Tensor bitmask_row_offsets(const Tensor& bits, int64_t rows, int64_t cols);

// x: (..., K) f32 cpu -> (..., N) f32, W (N, K) given by bits, values (nnz) f32 and row_offsets
// (N + 1) i64 from bitmask_row_offsets; bias (N) or undefined. Inference only: it records no
// graph, so an input that requires a gradient under grad mode is an error. `path`: the best one
// when not given; an unsupported one is an error. Scratch (X^T, Y^T) is allocated as workspace.
Tensor bitmask_linear(const Tensor& x, const Tensor& bits, const Tensor& values, const Tensor& row_offsets,
                      int64_t out_features, const Tensor& bias = Tensor(),
                      std::optional<SparseGemmPath> path = std::nullopt);

// 2:4 semi-structured (models/compress/sparse_24.h): W (N, K), K % 4 == 0, as values (N, K/2) f32
// and meta (N, ceil(K/8)) u8 (two 2-bit column indices per group of 4). x: (..., K) f32 cpu ->
// (..., N): N K M / 2 multiply-adds, no bitmask scan (every row keeps 2 of each 4). Same rules as
// bitmask_linear: inference only, paths bit-identical to the scalar one, scratch as workspace.
Tensor sparse24_linear(const Tensor& x, const Tensor& values, const Tensor& meta, int64_t out_features,
                       const Tensor& bias = Tensor(), std::optional<SparseGemmPath> path = std::nullopt);

}  // namespace mg
