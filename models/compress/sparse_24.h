// 2:4 semi-structured sparsity (the N:M pattern of NVIDIA's sparse tensor cores, Mishra et al.
// 2021): in every group of 4 consecutive weights along a row's input dimension at most 2 are
// nonzero. Pruning keeps the 2 largest |w| of each group (exactly 50%, spread evenly, so unlike
// unstructured sparsity every row keeps the same count and a kernel needs no bitmask scan).
// Compressed layout of a (rows, cols) weight, cols % 4 == 0 (a conv weight: cols = Cin kh kw):
//   values (rows, cols / 2): the kept values of each group, in order;
//   meta   (rows, ceil(cols / 8)) u8: a nibble per group, group g of a row in byte g / 2 (even g in
//          the low nibble): bits 0-1 the index (0-3) of its first kept value, bits 2-3 the second's,
//          first < second. A group with fewer than 2 nonzeros keeps a zero value at a free index.
// f32: 2 + 1/8 bytes per element instead of 4 (1.88x smaller), whatever the values.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "models/nn/module.h"

namespace mg {

inline constexpr int64_t k24Group = 4;  // M of N:M
inline constexpr int64_t k24Kept = 2;   // N of N:M

// Whether `w` can carry the pattern: >= 2 dims, its row length (numel / size(0)) a multiple of 4.
bool shape_fits_24(const Tensor& w);
// Zeroes the 2 smallest |w| of every group of 4 along each row, in place (ties: the lower index
// goes). cpu, contiguous, a shape that fits.
void prune_24_(const Tensor& w);
// Whether every group of 4 holds at most 2 nonzeros (false for a shape that does not fit).
bool is_24_sparse(const Tensor& w);

struct Sparse24 {
  Shape shape{};    // of the dense tensor
  Tensor values{};  // (rows, cols / 2) in the dense tensor's dtype
  Tensor meta{};    // (rows, ceil(cols / 8)) u8
  int64_t nbytes() const { return int64_t(values.nbytes() + meta.nbytes()); }
};
Sparse24 to_sparse_24(const Tensor& dense);  // cpu; an error when a group holds more than 2 nonzeros
Tensor to_dense(const Sparse24& s);          // a new cpu tensor; checks the parts' shapes and indices

// The weights 2:4 pruning applies to, by name: every Linear and every 1x1 ungrouped Conv2d whose
// input width is a multiple of 4 (MobileNetV2's depthwise and stem convs do not qualify).
NamedTensors prunable_24_weights(Module& model);

}  // namespace mg
