// Embedding lookup: out[n, :] = weight[indices[n], :] for indices of any shape (i64 or i32).
// The backward is a deterministic scatter-add into a dense (V, C) gradient: positions are first
// bucketed by vocabulary row (a counting sort into i64 workspace tensors), then the rows are
// summed in parallel, each row by one thread in the original order of its positions. No two
// threads ever add into one row, so the bits do not depend on the thread count.
// EmbeddingBackward saves only the indices (and V); it never reads the weight.
// On cuda:N (ops/cuda/embedding.cu) a stable radix sort gives the same per-row order.
#include "ops/cpu_loops.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Throws naming the first index outside [0, V) and where it sits.
template <class I>
void check_range(const I* idx, int64_t n, int64_t V, const Tensor& weight) {
  for (int64_t i = 0; i < n; ++i)
    MG_CHECK(idx[i] >= 0 && idx[i] < V, "embedding: index ", int64_t(idx[i]), " at position ", i,
             " is out of range for a vocabulary of ", V, " rows (weight ", shape_str(weight.shape()), ")");
}

// out (n, C) contiguous = rows of weight (V, C) (any strides) picked by idx (n).
template <class T, class I>
void gather_rows(const Tensor& out, const Tensor& weight, const I* idx, int64_t n) {
  const int64_t C = weight.size(1), s0 = weight.stride(0), s1 = weight.stride(1);
  T* po = typed_base<T>(out);
  const T* pw = typed_base<const T>(weight);
  parallel_for(0, n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* src = pw + int64_t(idx[i]) * s0;
      T* dst = po + i * C;
      if (s1 == 1) std::copy(src, src + C, dst);
      else for (int64_t c = 0; c < C; ++c) dst[c] = src[c * s1];
    }
  });
}

// The counting sort's workspace for n picks of V rows: ends (V) zeros, the end of each row's
// bucket, and order (n), the positions sorted by row. Allocated on meta too, as on cpu.
struct SortWorkspace {
  Tensor ends, order;
  SortWorkspace(int64_t V, int64_t n, const Device& d) {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    ends = zeros({V}, {.dtype = DType::i64, .device = d});
    order = empty({n}, {.dtype = DType::i64, .device = d});
  }
};

// acc (V, C) contiguous, compute type A = sum of the rows of g (n, C) (contiguous, dtype G) that
// idx sends to each vocabulary row; rows nobody picked become 0.
template <class A, class G, class I>
void scatter_add_rows(const Tensor& acc, const Tensor& g, const I* idx, int64_t n, const SortWorkspace& w) {
  const int64_t V = acc.size(0), C = acc.size(1);
  const Tensor &ends = w.ends, &order = w.order;
  int64_t* pe = ends.data<int64_t>();
  int64_t* po = order.data<int64_t>();
  // Counting sort, stable: bucket v holds its positions in increasing order.
  for (int64_t i = 0; i < n; ++i) ++pe[idx[i]];
  for (int64_t v = 1; v < V; ++v) pe[v] += pe[v - 1];
  for (int64_t i = n; i-- > 0;) po[--pe[idx[i]]] = i;  // pe[v] is now the start of bucket v
  const G* pg = typed_base<const G>(g);
  A* pa = typed_base<A>(acc);
  parallel_for(0, V, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v) {
      A* row = pa + v * C;
      std::fill(row, row + C, A(0));
      const int64_t end = v + 1 < V ? pe[v + 1] : n;
      for (int64_t k = pe[v]; k < end; ++k) {
        const G* src = pg + po[k] * C;
        for (int64_t c = 0; c < C; ++c) row[c] += A(compute_t<G>(src[c]));
      }
    }
  });
}

Tensor contiguous_workspace(const Tensor& t) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return contiguous(t.detach());
}

class EmbeddingBackward : public Node {
 public:
  explicit EmbeddingBackward(int64_t V) : V_(V) {}
  std::string_view name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const int64_t C = g[0].size(-1);
    Tensor idx = contiguous_workspace(indices.unpack());
    const int64_t n = idx.numel();
    Tensor gc = contiguous_workspace(g[0]);  // (n, C)
    Tensor dweight = empty({V_, C}, {.dtype = g[0].dtype(), .device = g[0].device()});  // (V, C)
    if (dweight.device().is_cuda()) {
      cuda::embedding_backward(dweight, gc, idx);
      return {dweight, Tensor()};
    }
    const bool wide = dweight.dtype() == DType::f32 || dweight.dtype() == DType::f64;
    Tensor acc = dweight;  // f16/bf16 sum in an f32 workspace and round once at the end (on meta too)
    if (!wide && dweight.numel() > 0) {
      MemoryCategoryGuard ws(MemoryCategory::workspace);
      acc = empty({V_, C}, {.dtype = DType::f32, .device = dweight.device()});
    }
    if (dweight.numel() == 0) return {dweight, Tensor()};
    {
      const SortWorkspace sort(V_, n, dweight.device());
      if (skip_kernel(dweight)) return {dweight, Tensor()};
      MG_DISPATCH_INDEX(idx.dtype(), "embedding", [&] {
        using I = scalar_t;
        const I* pi = idx.data<I>();
        MG_DISPATCH_FLOAT(gc.dtype(), "embedding", [&] {
          if (acc.dtype() == DType::f64) scatter_add_rows<double, scalar_t, I>(acc, gc, pi, n, sort);
          else scatter_add_rows<float, scalar_t, I>(acc, gc, pi, n, sort);
        });
      });
    }  // the sort's workspace goes back before the rounding copy, as it did inside scatter_add_rows
    if (!wide) copy_(dweight, acc);
    return {dweight, Tensor()};
  }
  SavedTensor indices{this};

 private:
  int64_t V_;
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  check_defined(op, weight, "weight");
  check_defined(op, indices, "indices");
  check_same_device(op, weight, indices);
  check_floating(op, weight);
  check_dim(op, weight, 2, "weight (V, C)");
  MG_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, "embedding: indices must be i64 or i32, got ",
           indices.dtype());
  OpNameGuard name(op);
  const int64_t V = weight.size(0), C = weight.size(1);
  Shape shape = indices.shape();
  shape.push_back(C);
  Tensor out = empty(shape, {.dtype = weight.dtype(), .device = weight.device()});  // (..., C)
  Tensor idx = contiguous_workspace(indices);  // on meta too: exact bytes
  if (!indices.is_meta()) {
    if (idx.device().is_cuda()) {
      cuda::check_indices(idx, V, weight);
      if (!skip_kernel(out)) cuda::embedding_forward(out, weight, idx);
    } else {
      MG_DISPATCH_INDEX(idx.dtype(), op, [&] {
        const scalar_t* pi = idx.data<scalar_t>();
        check_range(pi, idx.numel(), V, weight);
        if (!skip_kernel(out))
          MG_DISPATCH_FLOAT(weight.dtype(), op, [&] { gather_rows<scalar_t>(out, weight, pi, idx.numel()); });
      });
    }
  }
  if (auto node = make_node_if_needed<EmbeddingBackward>({weight}, V)) {
    node->indices.save(indices);
    set_history(node, {weight, indices}, {out});
  }
  return out;
}

}  // namespace mg
