// SparseLinear and Sparse24Linear (see sparse_linear.h): built from a dense Linear, multiplied by
// bitmask_linear / sparse24_linear.
#include "models/compress/sparse_linear.h"

#include "core/error.h"
#include "core/memory_category.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"
#include "ops/sparse_gemm.h"

namespace mg {

SparseLinear::SparseLinear(int64_t in, int64_t out) : Linear("SparseLinear", in, out) {}

std::shared_ptr<SparseLinear> SparseLinear::from_float(const Linear& src) {
  MG_CHECK(src.weight.defined() && src.weight.device().is_cpu() && src.weight.dtype() == DType::f32,
           "SparseLinear: expected a dense f32 cpu Linear, got a ", src.type_name(),
           src.weight.defined() ? " with weight " + std::string(dtype_name(src.weight.dtype())) + " on " +
                                      src.weight.device().str()
                                : std::string(" without a dense weight"));
  auto m = std::shared_ptr<SparseLinear>(new SparseLinear(src.in_features, src.out_features));
  MemoryCategoryGuard cat(MemoryCategory::parameter);
  BitmaskSparse s = to_bitmask_sparse(src.weight.detach());
  m->weight_bits = m->register_buffer("weight_bits", s.bits);
  m->weight_values = m->register_buffer("weight_values", s.values);
  m->weight_row_offsets = m->register_buffer("weight_row_offsets",
                                             bitmask_row_offsets(s.bits, src.out_features, src.in_features));
  if (src.bias.defined()) m->bias = m->register_buffer("bias", src.bias.detach());
  return m;
}

Tensor SparseLinear::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features, "SparseLinear: expected input (..., ",
           in_features, "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return bitmask_linear(x, weight_bits, weight_values, weight_row_offsets, out_features, bias);
}

double SparseLinear::sparsity() const {
  return 1.0 - double(weight_values.numel()) / double(in_features * out_features);
}

Sparse24Linear::Sparse24Linear(int64_t in, int64_t out) : Linear("Sparse24Linear", in, out) {}

std::shared_ptr<Sparse24Linear> Sparse24Linear::from_float(const Linear& src) {
  MG_CHECK(src.weight.defined() && src.weight.device().is_cpu() && src.weight.dtype() == DType::f32,
           "Sparse24Linear: expected a dense f32 cpu Linear, got a ", src.type_name());
  MG_CHECK(is_24_sparse(src.weight), "Sparse24Linear: the weight ", shape_str(src.weight.shape()),
           " is not 2:4 sparse (some group of 4 holds more than 2 nonzeros, or in_features is not a multiple of 4)");
  auto m = std::shared_ptr<Sparse24Linear>(new Sparse24Linear(src.in_features, src.out_features));
  MemoryCategoryGuard cat(MemoryCategory::parameter);
  Sparse24 s = to_sparse_24(src.weight.detach());
  m->weight_values = m->register_buffer("weight_values", s.values);
  m->weight_meta = m->register_buffer("weight_meta", s.meta);
  if (src.bias.defined()) m->bias = m->register_buffer("bias", src.bias.detach());
  return m;
}

Tensor Sparse24Linear::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features, "Sparse24Linear: expected input (..., ",
           in_features, "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return sparse24_linear(x, weight_values, weight_meta, out_features, bias);
}

SparsifyCounts sparsify_gpt(GPT& model, double min_sparsity) {
  MG_CHECK(min_sparsity >= 0.0 && min_sparsity <= 1.0, "sparsify_gpt: min_sparsity must be in [0, 1], got ",
           min_sparsity);
  SparsifyCounts c;
  auto swap = [&](Module& parent, const char* name, std::shared_ptr<Linear>& member) {
    MG_CHECK(member->type_name() == "Linear", "sparsify_gpt: '", name, "' is a ", member->type_name(),
             ", not a dense Linear\n  hint: the model is already converted (sparse or quantized)");
    const Tensor& w = member->weight;
    const double nnz = double(count_bits(nonzero_bits(w), w.numel()));
    if (1.0 - nnz / double(w.numel()) >= min_sparsity) {
      member = SparseLinear::from_float(*member);
      ++c.sparse;
    } else if (is_24_sparse(w)) {
      member = Sparse24Linear::from_float(*member);
      ++c.sparse24;
    } else {
      ++c.dense;
      return;
    }
    parent.replace_child(name, member);
  };
  for_each_block_linear(model, swap);
  return c;
}

}  // namespace mg
