// Sparse inference for unstructured pruning: a Linear whose weight is held as bitmask + packed
// nonzeros (the layout of sparse_format.h, plus per-row offsets) and multiplied with
// ops/sparse_gemm.h's kernel, so a pruned model loaded for inference takes 1/8 + 4 (1 - s) bytes
// per weight element instead of 4 (80%: 4.3x fewer) and skips the zeros' arithmetic. Only worth
// it above the sparsity where the kernel beats the dense GEMM (kSparseKernelMinSparsity, measured
// by bench/bench_sparse_gemm on the development machine), so layers below it stay dense.
// Inference only: no gradient flows through a SparseLinear.
#pragma once
#include <cstdint>
#include <memory>

#include "models/gpt.h"
#include "models/nn/layers.h"

namespace mg {

// bench_sparse_gemm on an AMD EPYC (Zen 4, one thread, AVX-512F and AVX2 paths): the sparse
// kernel beats the dense f32 GEMM from 0.60-0.75 sparsity on gpt-mini's and gpt-small's c_fc and
// from 0.70-0.75 on gpt-mini's MLP c_proj (K = 1024); from 0.75 it wins on all of them.
inline constexpr double kSparseKernelMinSparsity = 0.75;

// x: (..., in) f32 cpu -> (..., out).
class SparseLinear : public Linear {
 public:
  // The nonzeros of src's weight (cpu, f32), its bias shared; buffers under category parameter.
  static std::shared_ptr<SparseLinear> from_float(const Linear& src);
  Tensor forward(const Tensor& x) override;
  double sparsity() const;  // of the weight: 1 - nnz / (out * in)
  Tensor weight_bits;         // (ceil(out * in / 8)) u8: bit o * in + i set where W[o][i] != 0
  Tensor weight_values;       // (nnz) f32, row-major order
  Tensor weight_row_offsets;  // (out + 1) i64: row o's values start at weight_row_offsets[o]

 private:
  SparseLinear(int64_t in, int64_t out);
};

// x: (..., in) f32 cpu -> (..., out), the weight 2:4 sparse (sparse_24.h) and multiplied by
// sparse24_linear: 2 + 1/8 bytes per weight element instead of 4, half the multiply-adds.
class Sparse24Linear : public Linear {
 public:
  // src's weight must be 2:4 sparse (cpu, f32, in_features % 4 == 0); its bias shared.
  static std::shared_ptr<Sparse24Linear> from_float(const Linear& src);
  Tensor forward(const Tensor& x) override;
  Tensor weight_values;  // (out, in / 2) f32: the kept values of each group of 4
  Tensor weight_meta;    // (out, ceil(in / 8)) u8: their 2-bit column indices, two groups a byte

 private:
  Sparse24Linear(int64_t in, int64_t out);
};

struct SparsifyCounts {
  int64_t sparse = 0, sparse24 = 0, dense = 0;  // block Linears made bitmask / 2:4 sparse, left dense
};
// Every Linear of every block of `model` (cpu, f32) whose weight is at least `min_sparsity` zeros
// becomes a SparseLinear, else one whose weight is 2:4 sparse a Sparse24Linear; the dense weight
// is released when nothing else holds it. The model is for inference afterwards (eval, sample).
SparsifyCounts sparsify_gpt(GPT& model, double min_sparsity = kSparseKernelMinSparsity);

}  // namespace mg
