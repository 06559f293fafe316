// Joining and splitting: cat copies its inputs side by side along one dim into a new tensor;
// stack is cat of the inputs unsqueezed at the new dim; split returns views made by narrow (no
// copy). CatBackward saves no tensors, only the inputs' sizes along the dim: its gradients are
// narrow views of dout. SplitBackward (one node for all the parts) saves nothing either: it
// writes the parts' gradients side by side into one tensor of the input's shape, where a narrow
// per part would make one zero-filled input-sized tensor each for the engine to add up (GPT's
// q, k, v split: three (B, T, 3C) tensors and two adds per layer, now one tensor).
#include <cstring>

#include "autograd/grad_mode.h"
#include "core/parallel.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

class CatBackward : public Node {
 public:
  CatBackward(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  std::string_view name() const override { return "CatBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    std::vector<Tensor> dxs(sizes_.size());
    int64_t start = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (needs_input_grad(i)) dxs[i] = narrow(g[0], dim_, start, sizes_[i]);
      start += sizes_[i];
    }
    return dxs;
  }

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;  // each input's size along dim_
};

// dx's rows from the parts' rows when the split was along the last dim of CPU tensors and every
// part's gradient is contiguous in dx's dtype (GPT's q, k, v): one pass over the rows, each
// written whole from its parts, instead of a strided copy per part. False: not that case.
bool rows_side_by_side(const Tensor& dx, const std::vector<Tensor>& g) {
  if (!dx.device().is_cpu() || dx.dim() == 0) return false;
  const int64_t W = dx.size(-1), rows = dx.numel() / W;
  for (const Tensor& t : g)
    if (!t.defined() || !t.is_contiguous() || t.dtype() != dx.dtype() || t.dim() != dx.dim() ||
        t.numel() != rows * t.size(-1))
      return false;
  char* base = static_cast<char*>(dx.data_ptr());
  const size_t es = dx.element_size();
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(W, 1));
  parallel_for(0, rows, grain, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      char* d = base + size_t(r * W) * es;
      for (const Tensor& t : g) {
        const size_t n = size_t(t.size(-1)) * es;
        std::memcpy(d, static_cast<const char*>(t.data_ptr()) + size_t(r) * n, n);
        d += n;
      }
    }
  });
  return true;
}

class SplitBackward : public Node {
 public:
  SplitBackward(Shape in, int64_t dim, std::vector<int64_t> sizes)
      : in_(std::move(in)), dim_(dim), sizes_(std::move(sizes)) {}
  std::string_view name() const override { return "SplitBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor* any = nullptr;
    for (const Tensor& t : g) any = any ? any : (t.defined() ? &t : nullptr);
    Tensor dx = empty(in_, {.dtype = any->dtype(), .device = any->device()});  // (in_)
    if (skip_kernel(dx)) return {dx};
    if (dim_ == int64_t(in_.size()) - 1 && rows_side_by_side(dx, g)) return {dx};
    int64_t start = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      Tensor window = narrow(dx, dim_, start, sizes_[i]);
      if (g[i].defined()) copy_(window, g[i]);
      else fill_(window, 0.0);  // a part that got no gradient
      start += sizes_[i];
    }
    return {dx};
  }

 private:
  Shape in_;
  int64_t dim_;
  std::vector<int64_t> sizes_;  // each part's size along dim_
};

}  // namespace

// xs: n tensors of equal shape except along dim -> the shape with dim's sizes summed.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  const char* op = "cat";
  MG_CHECK(!xs.empty(), "cat: needs at least one tensor");
  for (size_t i = 0; i < xs.size(); ++i) check_defined(op, xs[i], "input");
  const Tensor& x0 = xs[0];
  MG_CHECK(x0.dim() > 0, "cat: cannot concatenate 0-d tensors (use stack)");
  const int64_t d = wrap_dim(dim, x0.dim(), op);
  Shape shape = x0.shape();
  shape[size_t(d)] = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_same_device(op, x0, x);
    check_same_dtype(op, x0, x);
    bool same = x.dim() == x0.dim();
    for (int64_t k = 0; same && k < x.dim(); ++k) same = k == d || x.size(k) == x0.size(k);
    MG_CHECK(same, "cat: tensor ", i, " has shape ", shape_str(x.shape()), ", expected ", shape_str(x0.shape()),
             " except along dimension ", d);
    sizes.push_back(x.size(d));
    shape[size_t(d)] += x.size(d);
  }
  OpNameGuard name(op);  // copy_ below runs on any device (the strided CUDA copy on cuda:N)
  Tensor out = empty(shape, {.dtype = x0.dtype(), .device = x0.device()});
  if (!skip_kernel(out)) {
    int64_t start = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      Shape st = out.strides();
      Shape sz = out.shape();
      sz[size_t(d)] = sizes[i];
      if (sizes[i] > 0) copy_(out.as_strided(sz, st, out.storage_offset() + start * st[size_t(d)]), xs[i]);
      start += sizes[i];
    }
  }
  if (auto node = make_node_if_needed<CatBackward>(xs, d, sizes)) set_history(node, xs, {out});
  return out;
}

// xs: n tensors of one shape S -> S with a new dim of size n at `dim`.
Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  MG_CHECK(!xs.empty(), "stack: needs at least one tensor");
  for (size_t i = 0; i < xs.size(); ++i) {
    check_defined("stack", xs[i], "input");
    MG_CHECK(xs[i].shape() == xs[0].shape(), "stack: tensor ", i, " has shape ", shape_str(xs[i].shape()),
             ", expected ", shape_str(xs[0].shape()), " (all inputs must have one shape)");
  }
  const int64_t d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (const Tensor& x : xs) us.push_back(unsqueeze(x, d));
  return cat(us, d);
}

// x -> views of split_size along dim (the last one shorter when the size does not divide).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  check_defined("split", x, "input");
  MG_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  MG_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.size(d);
  std::vector<Tensor> parts;
  std::vector<int64_t> sizes;
  {
    NoGradGuard views_only;  // the parts' history is one SplitBackward, set below
    if (n == 0) parts.push_back(narrow(x, d, 0, 0)), sizes.push_back(0);
    for (int64_t s = 0; s < n; s += split_size) {
      sizes.push_back(std::min(split_size, n - s));
      parts.push_back(narrow(x, d, s, sizes.back()));
    }
  }
  if (auto node = make_node_if_needed<SplitBackward>({x}, x.shape(), d, sizes)) set_history(node, {x}, parts);
  return parts;
}

}  // namespace mg
