// Reductions: sum (the primitive, with its backward), mean and var built from it, amax/argmax
// over one dim, max over everything, and sum_to (how broadcast gradients are reduced).
//
// Determinism: each output element is reduced by one thread in a fixed order; a reduction to a
// single value is split into chunks whose boundaries depend only on the shape, and the chunk
// partials are added in order, so the result has the same bits on 1 or 16 threads.
// SumBackward saves nothing (only the input shape); AmaxBackward saves input and output.
// On cuda:N the kernels are ops/cuda/reduce.cu (same results up to the order of float adds).
#include <algorithm>
#include <limits>

#include "core/parallel.h"
#include "core/strided_loop.h"
#include "ops/autocast_policy.h"
#include "ops/cuda/launchers.h"
#include "ops/op_utils.h"
#include "ops/ops.h"

namespace mg {
namespace {

std::vector<bool> reduced_mask(const char* op, const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> m(size_t(x.dim()), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, x.dim(), op);
    MG_CHECK(!m[size_t(w)] || dims.empty(), op, ": dimension ", w, " is listed twice");
    m[size_t(w)] = true;
  }
  return m;
}

Shape reduced_shape(const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  Shape s;
  for (size_t d = 0; d < mask.size(); ++d) {
    if (!mask[d]) s.push_back(x.shape()[d]);
    else if (keepdim) s.push_back(1);
  }
  return s;
}

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_integral_v<T>, int64_t, float>>;

// out (contiguous, kept dims in order) = sum over the masked dims of x.
template <class T>
void sum_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& mask) {
  using A = acc_t<T>;
  using O = T;
  Shape kept_sizes, kept_strides, red_sizes, red_strides;
  for (size_t d = 0; d < mask.size(); ++d) {
    (mask[d] ? red_sizes : kept_sizes).push_back(x.shape()[d]);
    (mask[d] ? red_strides : kept_strides).push_back(x.strides()[d]);
  }
  const T* base = static_cast<const T*>(x.storage()->data()) + x.storage_offset();
  O* o = static_cast<O*>(out.storage()->data()) + out.storage_offset();
  int64_t n_out = numel_of(kept_sizes);
  int64_t n_red = numel_of(red_sizes);
  int64_t red_rows = num_rows(red_sizes);
  auto reduce_rows = [&](int64_t start, int64_t rb, int64_t re) {
    A acc = 0;
    for_each_row<1>(red_sizes, {red_strides.data()}, {start}, rb, re,
                    [&](const std::array<int64_t, 1>& off, int64_t len, const std::array<int64_t, 1>& st) {
                      const T* p = base + off[0];
                      if (st[0] == 1)
                        for (int64_t i = 0; i < len; ++i) acc += A(compute_t<T>(p[i]));
                      else
                        for (int64_t i = 0; i < len; ++i) acc += A(compute_t<T>(p[i * st[0]]));
                    });
    return acc;
  };
  auto out_offset = [&](int64_t i) {  // element offset in x of output element i
    int64_t off = 0;
    for (size_t d = kept_sizes.size(); d-- > 0;) {
      off += (i % kept_sizes[d]) * kept_strides[d];
      i /= kept_sizes[d];
    }
    return off;
  };
  if (n_out == 1) {
    // One output: fixed chunks of rows, partials summed in order.
    int64_t row_len = red_sizes.empty() ? 1 : std::max<int64_t>(1, red_sizes.back());
    int64_t rows_per_chunk = std::max<int64_t>(1, 16384 / row_len);
    int64_t chunks = n_red == 0 ? 0 : (red_rows + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<A> partial(size_t(chunks), A(0));
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c)
        partial[size_t(c)] = reduce_rows(0, c * rows_per_chunk, std::min(red_rows, (c + 1) * rows_per_chunk));
    });
    A total = 0;
    for (A p : partial) total += p;
    o[0] = static_cast<O>(static_cast<compute_t<T>>(total));
    return;
  }
  // Reducing the leading dims of a contiguous tensor (a bias gradient: (R, K) -> (K)): walk
  // rows and accumulate a block of columns at a time, so memory is read in order. Each column is
  // still summed over rows 0..R-1 in order, whatever the thread count.
  bool leading_only = x.is_contiguous() && !mask.empty();
  for (size_t d = 1; d < mask.size(); ++d) leading_only = leading_only && !(mask[d] && !mask[d - 1]);
  if (leading_only && n_out > 1) {
    constexpr int64_t kCols = 256;
    parallel_for(0, n_out, kCols, [&](int64_t jb, int64_t je) {
      A acc[kCols] = {};
      for (int64_t r = 0; r < n_red; ++r) {
        const T* row = base + r * n_out;
        for (int64_t j = jb; j < je; ++j) acc[j - jb] += A(compute_t<T>(row[j]));
      }
      for (int64_t j = jb; j < je; ++j) o[j] = static_cast<O>(static_cast<compute_t<T>>(acc[j - jb]));
    });
    return;
  }
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n_red));
  parallel_for(0, n_out, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      o[i] = static_cast<O>(static_cast<compute_t<T>>(n_red == 0 ? A(0) : reduce_rows(out_offset(i), 0, red_rows)));
  });
}

class SumBackward : public Node {
 public:
  SumBackward(Shape in, Shape keep) : in_(std::move(in)), keep_(std::move(keep)) {}
  std::string_view name() const override { return "SumBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {contiguous(expand(reshape(g[0], keep_), in_))};
  }

 private:
  Shape in_, keep_;  // input shape, and the output's shape with reduced dims kept as 1
};

class AmaxBackward : public Node {
 public:
  AmaxBackward(int64_t dim, bool keepdim) : dim_(dim), keepdim_(keepdim) {}
  std::string_view name() const override { return "AmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor xv = x.unpack(), ov = out.unpack();
    Tensor ok = keepdim_ ? ov : unsqueeze(ov, dim_);
    Tensor gk = keepdim_ ? g[0] : unsqueeze(g[0], dim_);
    Tensor mask = cast(eq(xv, ok), xv.dtype());  // ties share the gradient evenly
    Tensor count = sum(mask, {dim_}, true);
    return {mul(div(mask, count), gk)};
  }
  SavedTensor x{this}, out{this};

 private:
  int64_t dim_;
  bool keepdim_;
};

// Max (and its index) over one dim: NaN wins, the first maximum's index is returned.
template <class T>
void amax_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim) {
  Shape outer = x.shape(), outer_st = x.strides();
  int64_t n = x.shape()[size_t(dim)], st = x.strides()[size_t(dim)];
  outer.erase(outer.begin() + dim);
  outer_st.erase(outer_st.begin() + dim);
  const T* base = static_cast<const T*>(x.storage()->data()) + x.storage_offset();
  T* v = values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr;
  int64_t* ix = indices.defined() ? static_cast<int64_t*>(indices.data_ptr()) : nullptr;
  int64_t m = numel_of(outer);
  parallel_for(0, m, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t off = 0, r = i;
      for (size_t d = outer.size(); d-- > 0;) {
        off += (r % outer[d]) * outer_st[d];
        r /= outer[d];
      }
      const T* p = base + off;
      compute_t<T> best = compute_t<T>(p[0]);
      int64_t bi = 0;
      for (int64_t k = 1; k < n; ++k) {
        compute_t<T> c = compute_t<T>(p[k * st]);
        if (best != best) break;  // NaN already won
        if (c > best || c != c) best = c, bi = k;
      }
      if (v) v[i] = static_cast<T>(best);
      if (ix) ix[i] = bi;
    }
  });
}

Tensor amax_impl(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool want_index) {
  check_defined(op, x, "input");
  OpNameGuard name(op);
  int64_t d = wrap_dim(dim, x.dim(), op);
  if (x.dim() == 0) return want_index ? zeros({}, {.dtype = DType::i64, .device = x.device()}) : x;
  MG_CHECK(x.shape()[size_t(d)] > 0, op, ": cannot reduce over dimension ", d, " of size 0");
  std::vector<bool> mask(size_t(x.dim()), false);
  mask[size_t(d)] = true;
  Shape shape = reduced_shape(x, mask, keepdim);
  Tensor out = empty(shape, {.dtype = want_index ? DType::i64 : x.dtype(), .device = x.device()});
  if (!skip_kernel(out)) {
    if (x.device().is_cuda()) {
      if (want_index) cuda::amax(Tensor(), out, x, d);
      else cuda::amax(out, Tensor(), x, d);
    } else {
      MG_DISPATCH_NUMERIC(x.dtype(), op, [&] {
        if (want_index) amax_kernel<scalar_t>(Tensor(), out, x, d);
        else amax_kernel<scalar_t>(out, Tensor(), x, d);
      });
    }
  }
  if (!want_index) {
    if (auto node = make_node_if_needed<AmaxBackward>({x}, d, keepdim)) {
      node->x.save(x);
      node->out.save(out);
      set_history(node, {x}, {out});
    }
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (autocast_wants_f32({x})) return sum(autocast_f32(x), dims, keepdim);
  const char* op = "sum";
  check_defined(op, x, "input");
  OpNameGuard name(op);
  std::vector<bool> mask = reduced_mask(op, x, dims);
  Shape shape = reduced_shape(x, mask, keepdim);
  DType out_dtype = x.dtype() == DType::b8 ? DType::i64 : x.dtype();
  Tensor out = empty(shape, {.dtype = out_dtype, .device = x.device()});
  if (!out.is_meta()) {
    Tensor src = x.dtype() == DType::b8 ? cast(x, DType::i64) : x;
    if (src.device().is_cuda()) cuda::sum(out, src, mask);
    else MG_DISPATCH_NUMERIC(src.dtype(), op, [&] { sum_kernel<scalar_t>(out, src, mask); });
  }
  if (auto node = make_node_if_needed<SumBackward>({x}, x.shape(), reduced_shape(x, mask, true)))
    set_history(node, {x}, {out});
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (autocast_wants_f32({x})) return mean(autocast_f32(x), dims, keepdim);
  check_defined("mean", x, "input");
  check_floating("mean", x);
  std::vector<bool> mask = reduced_mask("mean", x, dims);
  int64_t n = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) n *= x.shape()[d];
  return div(sum(x, dims, keepdim), double(n));
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  if (autocast_wants_f32({x})) return var(autocast_f32(x), dims, correction, keepdim);
  check_defined("var", x, "input");
  check_floating("var", x);
  std::vector<bool> mask = reduced_mask("var", x, dims);
  int64_t n = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) n *= x.shape()[d];
  MG_CHECK(n - correction > 0, "var: ", n, " elements with correction ", correction, " leave no degrees of freedom");
  Tensor centered = sub(x, mean(x, dims, true));
  return div(sum(mul(centered, centered), dims, keepdim), double(n - correction));
}

Tensor amax(const Tensor& x, int64_t dim, bool keepdim) { return amax_impl("amax", x, dim, keepdim, false); }
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return amax_impl("argmax", x, dim, keepdim, true); }

Tensor max(const Tensor& x) {
  check_defined("max", x, "input");
  MG_CHECK(x.numel() > 0, "max: the input is empty");
  return amax(reshape(x, {-1}), 0, false);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  MG_CHECK(x.dim() >= int64_t(shape.size()), "sum_to: cannot reduce ", shape_str(x.shape()), " to ", shape_str(shape));
  size_t lead = size_t(x.dim()) - shape.size();
  std::vector<int64_t> dims;
  for (size_t d = 0; d < size_t(x.dim()); ++d) {
    if (d < lead) dims.push_back(int64_t(d));
    else if (shape[d - lead] == 1 && x.shape()[d] != 1) dims.push_back(int64_t(d));
    else MG_CHECK(shape[d - lead] == x.shape()[d], "sum_to: ", shape_str(x.shape()), " does not broadcast from ", shape_str(shape));
  }
  if (dims.empty()) return reshape(x, shape);
  return reshape(sum(x, dims, true), shape);
}

}  // namespace mg
