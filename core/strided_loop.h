// Strided iteration: visits every element of an N-d shape in row-major order and hands the
// element offsets of up to N_T tensors (each with its own strides, 0 for broadcast dims) to a
// callback. The innermost dimension runs as a plain loop; an odometer walks the outer ones.
// Used by the core copy/fill primitives and by the element-wise kernels of ops/.
#pragma once
#include <array>
#include <cstdint>

#include "core/shape.h"

namespace mg {

// fn(const std::array<int64_t, N>& offsets, int64_t inner_len, const std::array<int64_t, N>& inner_strides)
// is called once per innermost row, for rows [row_begin, row_end) of the shape's
// numel / shape.back() rows (so callers can parallelise over rows).
template <size_t N, typename F>
void for_each_row(const Shape& shape, const std::array<const int64_t*, N>& strides,
                  const std::array<int64_t, N>& base, int64_t row_begin, int64_t row_end, F&& fn) {
  const int64_t nd = int64_t(shape.size());
  std::array<int64_t, N> inner{};
  int64_t len = 1;
  if (nd > 0) {
    len = shape[nd - 1];
    for (size_t k = 0; k < N; ++k) inner[k] = strides[k][nd - 1];
  }
  if (len == 0) return;
  // Decompose row_begin into an index over the outer dims.
  int64_t idx[16] = {0};
  std::array<int64_t, N> off = base;
  int64_t r = row_begin;
  for (int64_t d = nd - 2; d >= 0; --d) {
    idx[d] = r % shape[d];
    r /= shape[d];
    for (size_t k = 0; k < N; ++k) off[k] += idx[d] * strides[k][d];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    fn(off, len, inner);
    for (int64_t d = nd - 2; d >= 0; --d) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= idx[d] * strides[k][d];
      idx[d] = 0;
    }
  }
}

inline int64_t num_rows(const Shape& shape) {
  if (shape.empty()) return 1;
  return shape.back() == 0 ? 0 : numel_of(shape) / shape.back();
}

}  // namespace mg
