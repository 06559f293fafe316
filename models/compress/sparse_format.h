// Sparse storage for unstructured pruning: a tensor as a bitmask (bit i, LSB first in byte i/8,
// says whether element i in row-major order is nonzero) plus its nonzero values packed in order.
// At sparsity s an f32 weight takes numel/8 + (1-s) numel 4 bytes instead of 4 numel (80%: 4.3x
// smaller). In a safetensors file a sparse tensor is two entries, "<name>.__bits" (u8) and
// "<name>.__values", with its shape and dtype in the metadata ("sparse.<name>"), so the file
// stays valid safetensors; tensors that would not get smaller are stored dense.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "models/nn/module.h"

namespace mg {

// The bitmask of t's nonzeros: (ceil(numel / 8)) u8, under the calling thread's category. cpu.
Tensor nonzero_bits(const Tensor& t);
// t[i] = 0 wherever bit i of `bits` is 0, in place (bumps t's version). cpu, contiguous.
void apply_bits_(const Tensor& t, const Tensor& bits);
// Set bits among the first n.
int64_t count_bits(const Tensor& bits, int64_t n);

struct BitmaskSparse {
  Shape shape{};
  Tensor bits{};    // (ceil(numel / 8)) u8
  Tensor values{};  // (nnz) in the dense tensor's dtype
  int64_t nbytes() const { return int64_t(bits.nbytes() + values.nbytes()); }
};
BitmaskSparse to_bitmask_sparse(const Tensor& dense);  // cpu
Tensor to_dense(const BitmaskSparse& s);                // a new cpu tensor

// How save_sparse_safetensors stores a sparse tensor. two_four: a tensor of >= 2 dims that is 2:4
// sparse (sparse_24.h) as "<name>.__24values" + "<name>.__24meta" (shape in the metadata key
// "sparse24.<name>"), the layout Sparse24Linear runs from; any other as with bitmask.
enum class SparseLayout { bitmask, two_four };

// Writes `tensors`, each as bitmask + values when that is smaller than dense (or 2:4, above).
// Returns the tensor bytes written (excluding the header).
int64_t save_sparse_safetensors(const std::string& path, const NamedTensors& tensors,
                                SparseLayout layout = SparseLayout::bitmask);
// Reads such a file (either layout) back to dense tensors (file order of the dense entries and
// first parts).
// stored_bytes (optional): the tensor bytes the file holds. Throws naming the file and entry
// on a malformed sparse entry.
NamedTensors load_sparse_safetensors(const std::string& path, int64_t* stored_bytes = nullptr);

}  // namespace mg
