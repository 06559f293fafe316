// How strided tensors reach a row-major GEMM without copies, shared by the CPU matmul
// (ops/matmul.cpp) and the cuBLAS one (ops/cuda/matmul.cu): a (rows, cols) view as itself or as
// a transposed stored matrix with its leading dimension, the batch dims' strides (0 where
// broadcast), each batch's element offset, and when a batched product flattens into one GEMM.
// Plain C++ (no CUDA headers), so nvcc and the host compiler read the same code.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>

#include "core/shape.h"
#include "core/tensor.h"

namespace mg::gemm {

// How a (rows, cols) matrix with strides (rs, cs) is handed to a row-major GEMM without a copy:
// as itself with leading dimension rs (trans false), or as the transpose of a stored (cols, rows)
// matrix with leading dimension cs (trans true). nullopt when neither layout fits (no unit
// stride): the caller copies.
struct GemmView {
  bool trans;
  int64_t ld;
};
inline std::optional<GemmView> gemm_view(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const int64_t one = 1;
  if ((cs == 1 || cols <= 1) && (rows <= 1 || rs >= std::max(cols, one)))
    return GemmView{false, rows <= 1 ? std::max(cols, one) : rs};
  if ((rs == 1 || rows <= 1) && (cols <= 1 || cs >= std::max(rows, one)))
    return GemmView{true, cols <= 1 ? std::max(rows, one) : cs};
  return std::nullopt;
}

// Strides of t's batch dims (all but the last two) right-aligned to `batch`, 0 where broadcast.
inline Shape batch_strides(const Tensor& t, const Shape& batch) {
  Shape st(batch.size(), 0);
  size_t tb = size_t(t.dim()) - 2, lead = batch.size() - tb;
  for (size_t i = 0; i < tb; ++i) st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

// Element offset of flattened batch i for batch strides st.
inline int64_t batch_offset(int64_t i, const Shape& batch, const Shape& st) {
  int64_t off = 0;
  for (size_t d = batch.size(); d-- > 0;) {
    off += (i % batch[d]) * st[d];
    i /= batch[d];
  }
  return off;
}

// The stride s with batch_offset(i) == i * s over the flattened batch, if there is one
// (a strided-batched GEMM then needs no pointer arrays).
inline std::optional<int64_t> linear_batch_stride(const Shape& batch, const Shape& st) {
  std::optional<int64_t> s;
  int64_t inner = 1;
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] == 1) continue;
    if (!s) s = st[d];  // inner is 1 here: dims after d all have size 1
    else if (st[d] != *s * inner) return std::nullopt;
    inner *= batch[d];
  }
  return s ? s : std::optional<int64_t>(0);
}

// When b is shared by every batch and a's rows are evenly spaced across batches, the batched
// product is one (nb*N, K) x (K, M) GEMM. Returns the row stride of that flattened a, if any.
inline std::optional<int64_t> flat_row_stride(const Shape& batch, const Shape& sa, int64_t N, int64_t K,
                                              const GemmView& va) {
  if (va.trans) return std::nullopt;
  int64_t ld = N > 1 ? va.ld : -1;
  int64_t expected = -1;
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] == 1) continue;
    if (ld < 0) ld = sa[d];  // N == 1: rows are spaced by the innermost batch stride
    if (expected < 0) expected = N * ld;
    if (sa[d] != expected) return std::nullopt;
    expected *= batch[d];
  }
  if (ld < std::max<int64_t>(K, 1)) return std::nullopt;
  return ld;
}

}  // namespace mg::gemm
