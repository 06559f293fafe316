// Views and copies: reshape/view/flatten, transpose/permute, narrow/slice/select, expand,
// squeeze/unsqueeze share the input's storage (only strides and offset change); contiguous,
// clone, to(device) and cast copy. Every one is differentiable; views save no tensors at all,
// only the input's shape (their backward reshapes, permutes back, scatters or sums the gradient).
#include <numeric>
#include <optional>

#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Strides for viewing (sizes, strides) as `shape` without a copy, if possible (PyTorch's rule:
// dims can merge or split only within runs that are contiguous with each other).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  if (old_shape.empty() || numel_of(old_shape) == 0) return contiguous_strides(shape);
  Shape st(shape.size());
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[size_t(d)];
    if (d == 0 || (old_shape[size_t(d - 1)] != 1 && old_strides[size_t(d - 1)] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        st[size_t(view_d)] = view_numel * chunk_base;
        view_numel *= shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = old_strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

Shape infer_shape(const char* op, Shape shape, int64_t numel) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MG_CHECK(infer < 0, op, ": only one dimension can be -1, got ", shape_str(shape));
      infer = int64_t(i);
    } else {
      MG_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MG_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for ", numel, " elements");
    shape[size_t(infer)] = numel / known;
  }
  MG_CHECK(numel_of(shape) == numel, op, ": shape ", shape_str(shape), " is invalid for an input of ", numel, " elements");
  return shape;
}

class ReshapeBackward : public Node {
 public:
  explicit ReshapeBackward(Shape in) : in_(std::move(in)) {}
  std::string_view name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {reshape(g[0], in_)}; }

 private:
  Shape in_;
};

class PermuteBackward : public Node {
 public:
  explicit PermuteBackward(std::vector<int64_t> inverse) : inverse_(std::move(inverse)) {}
  std::string_view name() const override { return "PermuteBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {permute(g[0], inverse_)}; }

 private:
  std::vector<int64_t> inverse_;
};

// narrow / slice / select: the gradient is zero outside the window; the window is described by
// the view's (sizes, strides, offset) relative to a contiguous tensor of the input's shape.
class WindowBackward : public Node {
 public:
  WindowBackward(const char* name, Shape in, Shape sizes, Shape strides, int64_t offset)
      : name_(name), in_(std::move(in)), sizes_(std::move(sizes)), strides_(std::move(strides)), offset_(offset) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor dx = zeros(in_, {.dtype = g[0].dtype(), .device = g[0].device()});
    copy_(dx.as_strided(sizes_, strides_, offset_), g[0]);
    return {dx};
  }

 private:
  const char* name_;
  Shape in_, sizes_, strides_;
  int64_t offset_;
};

class ExpandBackward : public Node {
 public:
  explicit ExpandBackward(Shape in) : in_(std::move(in)) {}
  std::string_view name() const override { return "ExpandBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {sum_to(g[0], in_)}; }

 private:
  Shape in_;
};

class IdentityBackward : public Node {
 public:
  explicit IdentityBackward(const char* name) : name_(name) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0]}; }

 private:
  const char* name_;
};

class ToDeviceBackward : public Node {
 public:
  explicit ToDeviceBackward(Device src) : src_(src) {}
  std::string_view name() const override { return "ToDeviceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {to(g[0], src_)}; }

 private:
  Device src_;
};

class CastBackward : public Node {
 public:
  explicit CastBackward(DType src) : src_(src) {}
  std::string_view name() const override { return "CastBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {cast(g[0], src_)}; }

 private:
  DType src_;
};

// A view of x recorded with the given backward node.
template <class N, class... Args>
Tensor make_view(const Tensor& x, Shape sizes, Shape strides, int64_t offset, Args&&... args) {
  Tensor out = x.as_strided(std::move(sizes), std::move(strides), offset);
  if (auto node = make_node_if_needed<N>({x}, std::forward<Args>(args)...)) set_history(node, {x}, {out});
  return out;
}

}  // namespace

Tensor view(const Tensor& x, Shape shape) {
  check_defined("view", x, "input");
  shape = infer_shape("view", std::move(shape), x.numel());
  auto st = view_strides(x.shape(), x.strides(), shape);
  MG_CHECK(st.has_value(), "view: shape ", shape_str(shape), " is not compatible with the input's strides ",
           shape_str(x.strides()), " (sizes ", shape_str(x.shape()), ")\n  hint: use reshape (which copies when it must)");
  return make_view<ReshapeBackward>(x, shape, *st, x.storage_offset(), x.shape());
}

Tensor reshape(const Tensor& x, Shape shape) {
  check_defined("reshape", x, "input");
  shape = infer_shape("reshape", std::move(shape), x.numel());
  if (auto st = view_strides(x.shape(), x.strides(), shape))
    return make_view<ReshapeBackward>(x, shape, *st, x.storage_offset(), x.shape());
  return view(contiguous(x), shape);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  check_defined("flatten", x, "input");
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  MG_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape;
  for (int64_t d = 0; d < s; ++d) shape.push_back(x.shape()[size_t(d)]);
  int64_t m = 1;
  for (int64_t d = s; d <= e; ++d) m *= x.shape()[size_t(d)];
  shape.push_back(m);
  for (int64_t d = e + 1; d < x.dim(); ++d) shape.push_back(x.shape()[size_t(d)]);
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", x, "input");
  MG_CHECK(int64_t(dims.size()) == x.dim(), "permute: ", dims.size(), " dims given for a tensor with ", x.dim(),
           " dimensions");
  Shape sizes(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.dim(), "permute");
    MG_CHECK(inverse[size_t(d)] < 0, "permute: dimension ", d, " appears twice");
    inverse[size_t(d)] = int64_t(i);
    sizes[i] = x.shape()[size_t(d)];
    strides[i] = x.strides()[size_t(d)];
  }
  return make_view<PermuteBackward>(x, sizes, strides, x.storage_offset(), inverse);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_defined("transpose", x, "input");
  std::vector<int64_t> dims(size_t(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  if (x.dim() == 0) return x;
  std::swap(dims[size_t(wrap_dim(dim0, x.dim(), "transpose"))], dims[size_t(wrap_dim(dim1, x.dim(), "transpose"))]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_defined("slice", x, "input");
  int64_t d = wrap_dim(dim, x.dim(), "slice");
  int64_t n = x.shape()[size_t(d)];
  MG_CHECK(step > 0, "slice: step must be positive, got ", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sizes = x.shape(), strides = x.strides();
  sizes[size_t(d)] = (end - start + step - 1) / step;
  strides[size_t(d)] *= step;
  int64_t offset = x.storage_offset() + start * x.strides()[size_t(d)];
  // The same window in a contiguous gradient buffer of x's shape:
  Shape gstrides = contiguous_strides(x.shape());
  int64_t goffset = start * gstrides[size_t(d)];
  gstrides[size_t(d)] *= step;
  return make_view<WindowBackward>(x, sizes, strides, offset, "SliceBackward", x.shape(), sizes, gstrides, goffset);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined("narrow", x, "input");
  int64_t d = wrap_dim(dim, x.dim(), "narrow");
  int64_t n = x.shape()[size_t(d)];
  MG_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: window [", start, ", ", start + length,
           ") is outside dimension ", d, " of size ", n);
  return slice(x, d, start, start + length, 1);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  check_defined("select", x, "input");
  MG_CHECK(x.dim() > 0, "select: cannot select from a 0-d tensor");
  int64_t d = wrap_dim(dim, x.dim(), "select");
  int64_t n = x.shape()[size_t(d)];
  MG_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ", d, " of size ", n);
  if (index < 0) index += n;
  Shape sizes = x.shape(), strides = x.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  int64_t offset = x.storage_offset() + index * x.strides()[size_t(d)];
  Shape gstrides = contiguous_strides(x.shape());
  int64_t goffset = index * gstrides[size_t(d)];
  gstrides.erase(gstrides.begin() + d);
  return make_view<WindowBackward>(x, sizes, strides, offset, "SelectBackward", x.shape(), sizes, gstrides, goffset);
}

Tensor expand(const Tensor& x, Shape shape) {
  check_defined("expand", x, "input");
  MG_CHECK(shape.size() >= size_t(x.dim()), "expand: cannot expand ", shape_str(x.shape()), " to fewer dimensions ",
           shape_str(shape));
  size_t lead = shape.size() - size_t(x.dim());
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      MG_CHECK(shape[i] >= 0, "expand: size -1 is not allowed for a new leading dimension");
      continue;
    }
    int64_t xs = x.shape()[i - lead];
    if (shape[i] == -1) shape[i] = xs;
    MG_CHECK(xs == shape[i] || xs == 1, "expand: dimension ", i, " of size ", xs, " cannot expand to ", shape[i],
             " (input ", shape_str(x.shape()), ", target ", shape_str(shape), ")");
    strides[i] = xs == 1 && shape[i] != 1 ? 0 : x.strides()[i - lead];
  }
  if (shape == x.shape()) return x;
  return make_view<ExpandBackward>(x, shape, strides, x.storage_offset(), x.shape());
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  check_defined("squeeze", x, "input");
  if (x.dim() == 0) return x;
  int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.shape()[size_t(d)] != 1) return x;
  Shape sizes = x.shape(), strides = x.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view<ReshapeBackward>(x, sizes, strides, x.storage_offset(), x.shape());
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  check_defined("unsqueeze", x, "input");
  int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape sizes = x.shape(), strides = x.strides();
  int64_t st = size_t(d) < strides.size() ? strides[size_t(d)] * sizes[size_t(d)] : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return make_view<ReshapeBackward>(x, sizes, strides, x.storage_offset(), x.shape());
}

Tensor clone(const Tensor& x) {
  check_defined("clone", x, "input");
  OpNameGuard name("clone");
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  copy_(out, x);
  if (auto node = make_node_if_needed<IdentityBackward>({x}, "CloneBackward")) set_history(node, {x}, {out});
  return out;
}

Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", x, "input");
  if (x.is_contiguous()) return x;
  OpNameGuard name("contiguous");
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  copy_(out, x);
  if (auto node = make_node_if_needed<IdentityBackward>({x}, "ContiguousBackward")) set_history(node, {x}, {out});
  return out;
}

Tensor to(const Tensor& x, Device device) {
  check_defined("to", x, "input");
  if (x.device() == device) return x;
  OpNameGuard name("to");
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = device});
  if (!x.is_meta() && !device.is_meta()) {
    Tensor c = x.is_contiguous() ? x : contiguous(x.detach());
    copy_(out, c);
  } else {
    MG_CHECK(device.is_meta(), "to: cannot move a meta tensor to ", device.str(), ": meta tensors have no data");
  }
  if (auto node = make_node_if_needed<ToDeviceBackward>({x}, x.device())) set_history(node, {x}, {out});
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "input");
  if (x.dtype() == dtype) return x;
  OpNameGuard name("cast");  // copy_ converts on any device (the CUDA strided copy on cuda:N)
  Tensor out = empty(x.shape(), {.dtype = dtype, .device = x.device()});
  copy_(out, x);
  if (is_floating(dtype) && is_floating(x.dtype())) {
    if (auto node = make_node_if_needed<CastBackward>({x}, x.dtype())) set_history(node, {x}, {out});
  }
  return out;
}

}  // namespace mg
