// What the two attention paths share (ops/attention.cpp, the materialised reference, and
// ops/flash_attention.cpp, the tiled default on every device): input checks, the compute dtype (f32,
// f64 for f64) and the workspace copies that bring 16-bit or oddly strided operands to it.
// Dropout rule of both: weight (s, i, j) is kept iff uniform(seed, offset + (s*T + i)*T + j) >= p.
#pragma once
#include "core/rng.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg::attention_detail {

inline DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The checks of scaled_dot_product_attention (both paths), naming op.
void check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p);

// t as a tensor of dtype c whose last dimension is contiguous: t itself when it already is one
// (contiguous_only: t must be fully contiguous), else a workspace copy.
Tensor as_compute(const Tensor& t, DType c, bool contiguous_only = true);

// Where a kernel writes a result of dtype `dst`: dst itself when it is the compute dtype, else
// an f32 workspace tensor to be rounded into dst by finish().
Tensor compute_target(const Tensor& dst, DType c);
void finish(const Tensor& dst, const Tensor& computed);

template <class C>
C* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<C>() : nullptr;
}

// The dropout stream positions reserved for an attention over S slices of T x T weights.
struct DropoutDraw {
  double p = 0.0;  // 0: no dropout
  uint64_t seed = 0, offset = 0;
};
DropoutDraw reserve_dropout(double p, Generator* gen, int64_t S, int64_t T);

}  // namespace mg::attention_detail

namespace mg {
// The tiled path (ops/flash_attention.cpp, kernels for cuda:N in ops/cuda/flash_attention.cu),
// called by scaled_dot_product_attention after check_inputs on every device.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                       Generator* gen);
}  // namespace mg
