// Tensor: a cheap handle (shared_ptr) to a TensorImpl = storage + offset + sizes + strides +
// dtype, plus the autograd fields (requires_grad, grad, grad_fn). Views share storage. This file
// holds only what needs no arithmetic; the differentiable functions (reshape, add, matmul, ...)
// live in ops/ops.h and take tensors through this interface.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace mg {

class Node;  // autograd/node.h
class Tensor;

// Called once a leaf's gradient of a backward pass has been accumulated (data parallelism).
using GradReadyHook = std::function<void(const Tensor& grad)>;

struct AutogradMeta;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape sizes;
  Shape strides;  // in elements
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;  // null until requires_grad, grad or grad_fn is set
  ~TensorImpl();
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl()->sizes; }
  const Shape& strides() const { return impl()->strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return int64_t(impl()->sizes.size()); }
  int64_t numel() const { return numel_of(impl()->sizes); }
  DType dtype() const { return impl()->dtype; }
  size_t element_size() const { return dtype_size(impl()->dtype); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  Device device() const { return impl()->storage->device(); }
  int64_t storage_offset() const { return impl()->offset; }
  const std::shared_ptr<Storage>& storage() const { return impl()->storage; }
  bool is_contiguous() const;
  bool is_meta() const { return device().is_meta(); }

  // Pointer to the first element. Throws on meta. The typed form checks the dtype.
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    MG_CHECK(dtype() == dtype_of_v<T>, "Tensor::data<", dtype_of_v<T>, ">: tensor has dtype ", dtype());
    return static_cast<T*>(data_ptr());
  }
  // The single element of a one-element tensor, converted to T (any dtype, any cpu device).
  template <typename T = double>
  T item() const {
    return static_cast<T>(item_double());
  }
  double item_double() const;
  // All elements in logical (row-major) order, converted to T. For tests and small tensors.
  template <typename T>
  std::vector<T> to_vector() const {
    std::vector<double> v = to_double_vector();
    return std::vector<T>(v.begin(), v.end());
  }
  std::vector<double> to_double_vector() const;

  // Autograd fields (the engine lives in autograd/).
  bool requires_grad() const;
  // Marks a leaf as needing a gradient. Only floating tensors can require grad.
  Tensor& set_requires_grad(bool r);
  const Tensor& grad() const;  // undefined tensor when there is none
  void set_grad(const Tensor& g) const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  void set_grad_fn(std::shared_ptr<Node> fn, uint32_t output_nr) const;
  bool is_leaf() const { return !grad_fn(); }
  void add_grad_ready_hook(GradReadyHook h) const;
  const std::vector<GradReadyHook>& grad_ready_hooks() const;

  // Version counter shared by every view of the storage; in-place writes bump it.
  uint64_t version() const { return storage()->version(); }
  void bump_version() const { storage()->bump_version(); }

  // A view of the same storage (no autograd: ops/ wraps this in differentiable view ops).
  Tensor as_strided(Shape sizes, Shape strides, int64_t offset) const;
  // Same storage and data, no grad_fn, requires_grad false (autograd-free alias).
  Tensor detach() const;

  TensorImpl* impl() const {
    MG_CHECK(impl_ != nullptr, "operation on an undefined tensor");
    return impl_.get();
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // "tensor([[1.0000, 2.0000], ...], dtype=f32, device=cpu:0, grad_fn=AddBackward)".
  std::string str() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::vector<GradReadyHook> grad_ready_hooks;
};

// Options for the factories: mg::zeros({2, 3}, {.dtype = DType::f64, .device = "cpu:1"}).
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = kCPU;
  bool requires_grad = false;
};

// Factories (memory from allocator_for(device) under the current category; no data on meta).
Tensor empty(const Shape& shape, const TensorOptions& opt = {});
Tensor zeros(const Shape& shape, const TensorOptions& opt = {});
Tensor ones(const Shape& shape, const TensorOptions& opt = {});
Tensor full(const Shape& shape, double value, const TensorOptions& opt = {});
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& opt = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
// Copies the values (converted to opt.dtype) into a new tensor of `shape`.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& opt = {});
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opt) {
  return from_vector(std::vector<double>(values.begin(), values.end()), shape, opt);
}
// A 0-d tensor.
Tensor scalar_tensor(double value, const TensorOptions& opt = {});

// Fills `t` in place (any strides); bumps its version. No-op on meta.
void fill_(const Tensor& t, double value);
// Copies src's elements into dst (same shape, any strides and dtypes, any cpu devices); bumps dst.
void copy_(const Tensor& dst, const Tensor& src);
// dst += src (same shape and dtype): how the autograd engine sums gradients. Bumps dst.
void accumulate_(const Tensor& dst, const Tensor& src);
// A contiguous copy of t's bytes into `dst` (t.nbytes() bytes, host memory).
void copy_to_contiguous_bytes(const Tensor& t, void* dst);

}  // namespace mg
