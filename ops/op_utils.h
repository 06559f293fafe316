// Shared checks and helpers for op implementations: input validation with messages that name
// the op, devices and dtypes; output allocation; and the rule that kernels do not run on meta.
#pragma once
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/memory_category.h"
#include "core/tensor.h"

namespace mg {

inline void check_defined(const char* op, const Tensor& t, const char* what) {
  MG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// Every tensor of an op must live on one device; moving data is always an explicit to().
inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.device() == b.device(), op, ": tensors are on different devices, ", a.device().str(), " and ",
           b.device().str(), "\n  hint: move one with mg::to(t, device)");
}

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ, ", a.dtype(), " and ", b.dtype(),
           "\n  hint: convert one with mg::cast(t, dtype)");
}

inline void check_floating(const char* op, const Tensor& t) {
  MG_CHECK(is_floating(t.dtype()), op, ": expected a floating tensor (f32, f64, f16, bf16), got ", t.dtype());
}

inline void check_dim(const char* op, const Tensor& t, int64_t ndim, const char* what) {
  MG_CHECK(t.dim() == ndim, op, ": ", what, " must have ", ndim, " dimensions, got shape ", shape_str(t.shape()));
}

// The device kernel can be skipped: meta has no data, and empty tensors have nothing to compute.
inline bool skip_kernel(const Tensor& out) { return out.is_meta() || out.numel() == 0; }

// Creates node N(args...) and wires it when an input needs a gradient; returns nullptr otherwise.
template <typename N, typename... Args>
std::shared_ptr<N> make_node_if_needed(const std::vector<Tensor>& inputs, Args&&... args) {
  if (!any_requires_grad(inputs)) return nullptr;
  return std::make_shared<N>(std::forward<Args>(args)...);
}

// Strides that walk `t` as if broadcast to `shape` (0 along broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& shape);

}  // namespace mg
