// Matrix products: matmul (2-D, batched with broadcast batch dims, 1-D operands as in NumPy) and
// linear (one GEMM over the flattened leading dims; the bias is added in the same pass: the GEMM
// starts its sums from the bias, cpu_gemm_bias for f32, else the output rows are filled with the
// bias and the GEMM accumulates onto them with beta = 1). Every
// product goes through cpu_gemm; f16/bf16 operands are converted to f32 a tile at a time inside
// the GEMM (ops/cpu_gemm.h), multiplied in f32 and rounded on store; f64 uses dgemm. Transposed views are passed to the
// GEMM as transposed operands, never copied.
//
// What each backward saves (only what it reads, only when that gradient is needed):
// MatmulBackward saves a if b needs a gradient (db = a^T dC) and b if a does (da = dC b^T);
// LinearBackward saves x if weight needs a gradient (dweight = dout^T x) and weight if x does
// (dx = dout weight); dbias is a column sum of dout and needs nothing saved.
#include <optional>
#include <type_traits>

#include "ops/autocast_policy.h"
#include "ops/bias_grad.h"
#include "ops/cpu_gemm.h"
#include "ops/cpu_loops.h"
#include "ops/cuda/launchers.h"
#include "ops/gemm_view.h"
#include "core/flop_counter.h"
#include "ops/ops.h"

namespace mg {
namespace {

// Per-batch GEMMs at most this many multiply-adds run in parallel over batches, each one serial
// (cpu_gemm runs its tiles inline inside a parallel region); larger ones run one after another,
// each using every thread. The choice depends only on shapes, not on the thread count.
constexpr int64_t kSmallGemmMacs = int64_t(1) << 21;  // 128^3
constexpr int64_t kBatchLanes = 16;  // lanes the parallel batches are dealt to (shapes decide, not threads)

using gemm::batch_offset;
using gemm::batch_strides;
using gemm::flat_row_stride;
using gemm::gemm_view;
using gemm::GemmView;

// out (batch..., N, M), contiguous, dtype C: out = a b + beta * out, where a (..., N, K) and
// b (..., K, M) have dtype C, any strides, and batch dims that broadcast to out's.
// One GEMM call in C's own type: f32 / f64 directly, f16 / bf16 through the converting GEMM with
// `ws` its f32 workspace (Note [GEMM lanes] in cpu_gemm.cpp).
template <class C>
void gemm_as(Transpose ta, Transpose tb, int64_t N, int64_t M, int64_t K, const C* a, int64_t lda, const C* b,
             int64_t ldb, compute_t<C> beta, C* o, int64_t ldo, float* ws) {
  if constexpr (std::is_same_v<C, compute_t<C>>) cpu_gemm(ta, tb, N, M, K, C(1), a, lda, b, ldb, beta, o, ldo);
  else cpu_gemm(ta, tb, N, M, K, 1.0f, a, lda, b, ldb, beta, o, ldo, ws);
}

// How bmm_kernel runs a product, decided by the shapes alone: one GEMM over every batch's rows
// (b shared and a's rows flat), batches in parallel (small GEMMs) on lanes, or batches in turn.
enum class BmmPath { flat, parallel, serial };

// The kernel of run_product. Everything it allocates (contiguous copies of operands a GEMM cannot
// read in place, the 16-bit GEMM's f32 panels) it allocates on every device, meta included, and
// only then stops on meta: the meta device sees the workspace of the real run.
template <class C>
void bmm_kernel(const Tensor& out, Tensor a, Tensor b, compute_t<C> beta) {
  const int64_t N = a.size(-2), K = a.size(-1), M = b.size(-1);
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  const int64_t nb = numel_of(batch);
  if (out.numel() == 0) return;
  if (K == 0) {  // an empty sum
    if (out.is_meta()) return;
    C* po = typed_base<C>(out);
    for (int64_t i = 0; i < out.numel(); ++i) po[i] = C(beta == 0 ? compute_t<C>(0) : beta * compute_t<C>(po[i]));
    return;
  }
  std::optional<GemmView> va = gemm_view(N, K, a.stride(-2), a.stride(-1));
  std::optional<GemmView> vb = gemm_view(K, M, b.stride(-2), b.stride(-1));
  if (!va || !vb) {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    if (!va) a = contiguous(a), va = gemm_view(N, K, K, 1);
    if (!vb) b = contiguous(b), vb = gemm_view(K, M, M, 1);
  }
  Shape sa = batch_strides(a, batch), sb = batch_strides(b, batch);
  const bool b_shared = std::all_of(sb.begin(), sb.end(), [](int64_t s) { return s == 0; });
  const std::optional<int64_t> flat_ld = nb > 1 && b_shared ? flat_row_stride(batch, sa, N, K, *va) : std::nullopt;
  const BmmPath path = flat_ld ? BmmPath::flat : nb > 1 && N * M * K <= kSmallGemmMacs ? BmmPath::parallel : BmmPath::serial;
  // 16-bit: the GEMM's f32 panels, one GEMM's worth per lane of batches (Note [GEMM lanes]).
  constexpr bool low = !std::is_same_v<C, compute_t<C>>;
  const int64_t lanes = path == BmmPath::parallel ? std::min(kBatchLanes, nb) : 1;
  const int64_t per_gemm = !low ? 0 : path == BmmPath::flat ? cpu_gemm_workspace_floats(nb * N, M, K)
                                                            : cpu_gemm_workspace_floats(N, M, K);
  count_flops(gemm_kind(out.dtype()), 2.0 * double(nb) * double(N) * double(M) * double(K));
  Tensor ws;
  if (per_gemm > 0) {
    MemoryCategoryGuard tag(MemoryCategory::workspace);
    ws = empty({lanes, per_gemm}, {.dtype = DType::f32, .device = out.device()});
  }
  if (out.is_meta()) return;
  float* pws = ws.defined() ? ws.data<float>() : nullptr;
  C* po = typed_base<C>(out);
  const C* pa = typed_base<const C>(a);
  const C* pb = typed_base<const C>(b);
  if (path == BmmPath::flat) {
    gemm_as<C>(Transpose::no, Transpose(vb->trans), nb * N, M, K, pa, *flat_ld, pb, vb->ld, beta, po, M, pws);
    return;
  }
  auto one = [&](int64_t i, float* w) {
    gemm_as<C>(Transpose(va->trans), Transpose(vb->trans), N, M, K, pa + batch_offset(i, batch, sa), va->ld,
               pb + batch_offset(i, batch, sb), vb->ld, beta, po + i * N * M, M, w);
  };
  if (path == BmmPath::parallel) {
    parallel_for(0, lanes, 1, [&](int64_t s, int64_t e) {
      for (int64_t lane = s; lane < e; ++lane)
        for (int64_t i = lane; i < nb; i += lanes) one(i, pws ? pws + lane * per_gemm : nullptr);
    });
  } else {
    for (int64_t i = 0; i < nb; ++i) one(i, pws);
  }
}

// Every row of the contiguous (rows, M) matrix `out` set to bias (M) (dtype C, any stride).
template <class C>
void fill_rows(const Tensor& out, const Tensor& bias) {
  const int64_t M = bias.numel(), rows = M == 0 ? 0 : out.numel() / M, bs = bias.stride(0);
  C* po = typed_base<C>(out);
  const C* pb = typed_base<const C>(bias);
  parallel_for(0, rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(M, 1)), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r)
      for (int64_t j = 0; j < M; ++j) po[r * M + j] = pb[j * bs];
  });
}

// linear's f32 product with its bias on the CPU when both operands reach the GEMM without a copy:
// cpu_gemm_bias starts C's sums from the bias (the bits of fill_rows then beta = 1, one pass over
// the output fewer). out (N, M) contiguous, a (N, K), b (K, M), bias (M). False: not handled.
bool linear_f32_with_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (out.dtype() != DType::f32 || out.dim() != 2 || a.dim() != 2 || b.dim() != 2 || bias.stride(0) != 1 ||
      out.is_meta() || out.numel() == 0)
    return false;
  const int64_t N = a.size(0), K = a.size(1), M = b.size(1);
  const std::optional<GemmView> va = gemm_view(N, K, a.stride(0), a.stride(1));
  const std::optional<GemmView> vb = gemm_view(K, M, b.stride(0), b.stride(1));
  if (!va || !vb) return false;
  count_flops(gemm_kind(out.dtype()), 2.0 * double(N) * double(M) * double(K));
  cpu_gemm_bias(Transpose(va->trans), Transpose(vb->trans), N, M, K, 1.0f, typed_base<const float>(a), va->ld,
                typed_base<const float>(b), vb->ld, typed_base<const float>(bias), typed_base<float>(out), M);
  return true;
}

// out (..., N, M) = a b (+ bias (M) on every row), in out's dtype (accumulated in f32 for f16/bf16).
// Inputs are detached: nothing here records history.
void run_product(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in) {
  Tensor a = a_in.detach(), b = b_in.detach(), bias = bias_in.defined() ? bias_in.detach() : Tensor();
  if (out.device().is_cuda()) return cuda::matmul(out, a, b, bias);  // cuBLAS (ops/cuda/matmul.cu)
  if (bias.defined() && linear_f32_with_bias(out, a, b, bias)) return;
  MG_DISPATCH_FLOAT(out.dtype(), "matmul", [&] {
    if (bias.defined() && !out.is_meta()) fill_rows<scalar_t>(out, bias);
    bmm_kernel<scalar_t>(out, a, b, bias.defined() ? 1 : 0);
  });
}

void check_operands(const char* op, const Tensor& a, const Tensor& b, const char* an, const char* bn) {
  check_defined(op, a, an);
  check_defined(op, b, bn);
  check_same_device(op, a, b);
  check_same_dtype(op, a, b);
  check_floating(op, a);
}

class MatmulBackward : public Node {
 public:
  MatmulBackward(Shape a_shape, Shape b_shape) : a_shape_(std::move(a_shape)), b_shape_(std::move(b_shape)) {}
  std::string_view name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor& dc = g[0];  // (batch..., N, M)
    Tensor da, db;
    if (needs_input_grad(0)) da = sum_to(matmul(dc, transpose(b.unpack(), -1, -2)), a_shape_);
    if (needs_input_grad(1)) {
      Tensor av = a.unpack();
      if (b_shape_.size() == 2 && a_shape_.size() > 2) {
        // b shared by every batch: one (K, rows) x (rows, M) product, no (batch, K, M) temporary.
        int64_t K = a_shape_.back(), M = b_shape_.back();
        db = matmul(transpose(reshape(av, {-1, K}), 0, 1), reshape(dc, {-1, M}));
      } else {
        db = sum_to(matmul(transpose(av, -1, -2), dc), b_shape_);
      }
    }
    return {da, db};
  }
  SavedTensor a{this}, b{this};

 private:
  Shape a_shape_, b_shape_;
};

class LinearBackward : public Node {
 public:
  explicit LinearBackward(Shape x_shape) : x_shape_(std::move(x_shape)) {}
  std::string_view name() const override { return "LinearBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const int64_t in = x_shape_.back();
    Tensor g2 = reshape(g[0], {-1, g[0].shape().back()});  // (R, out)
    Tensor dx, dweight, dbias;
    if (needs_input_grad(0)) dx = reshape(matmul(g2, weight.unpack()), x_shape_);              // (R, in)
    if (needs_input_grad(1)) dweight = matmul(transpose(g2, 0, 1), reshape(x.unpack(), {-1, in}));  // (out, in)
    if (needs_input_grad(2)) dbias = bias_grad(g2);                                            // (out)
    return {dx, dweight, dbias};
  }
  SavedTensor x{this}, weight{this};

 private:
  Shape x_shape_;
};

}  // namespace

Tensor bias_grad(const Tensor& g2) {
  if (g2.dtype() != DType::f32 || !g2.device().is_cpu() || !g2.is_contiguous() || g2.dim() != 2 || g2.size(0) == 0)
    return sum(g2, {0});
  OpNameGuard name("sum");  // the op it stands for, in profiles
  const int64_t R = g2.size(0), N = g2.size(1);
  Tensor out = empty({N}, {.dtype = DType::f32, .device = g2.device()});  // (out)
  if (skip_kernel(out)) return out;
  constexpr int64_t kCols = 64;
  const float* pg = typed_base<const float>(g2);
  float* po = typed_base<float>(out);
  parallel_for(0, (N + kCols - 1) / kCols, 1, [&](int64_t bb, int64_t be) {
    for (int64_t blk = bb; blk < be; ++blk) {
      const int64_t j0 = blk * kCols, n = std::min(kCols, N - j0);
      float acc[kCols] = {};
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < n; ++j) acc[j] += pg[r * N + j0 + j];
      std::copy(acc, acc + n, po + j0);
    }
  });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (autocast_wants_low({a, b})) return matmul(autocast_low(a), autocast_low(b));
  const char* op = "matmul";
  check_operands(op, a, b, "first operand", "second operand");
  MG_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dimension, got shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  MG_CHECK(ka == kb, "matmul: inner dimensions differ: ", shape_str(a.shape()), " vs ", shape_str(b.shape()),
           " (", ka, " != ", kb, ")");
  if (a.dim() == 1 || b.dim() == 1) {
    // NumPy rule: a 1-D a is a row (1, K), a 1-D b a column (K, 1); the added dim is removed again.
    Tensor out = matmul(a.dim() == 1 ? unsqueeze(a, 0) : a, b.dim() == 1 ? unsqueeze(b, 1) : b);
    if (b.dim() == 1) out = squeeze(out, -1);
    if (a.dim() == 1) out = squeeze(out, b.dim() == 1 ? -1 : -2);
    return out;
  }
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch(std::max(ba.size(), bb.size()), 1);
  for (size_t i = 0; i < batch.size(); ++i) {
    int64_t x = i < batch.size() - ba.size() ? 1 : ba[i - (batch.size() - ba.size())];
    int64_t y = i < batch.size() - bb.size() ? 1 : bb[i - (batch.size() - bb.size())];
    MG_CHECK(x == y || x == 1 || y == 1, "matmul: batch dimensions ", shape_str(ba), " and ", shape_str(bb),
             " do not broadcast (shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), ")");
    batch[i] = x == 1 ? y : x;
  }
  OpNameGuard name(op);
  Shape shape = batch;
  shape.push_back(a.size(-2));
  shape.push_back(b.size(-1));
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});  // (batch..., N, M)
  run_product(out, a, b, Tensor());  // on meta too: it allocates its workspace, then stops
  if (auto node = make_node_if_needed<MatmulBackward>({a, b}, a.shape(), b.shape())) {
    if (b.requires_grad()) node->a.save(a);
    if (a.requires_grad()) node->b.save(b);
    set_history(node, {a, b}, {out});
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast_wants_low({x, weight, bias})) return linear(autocast_low(x), autocast_low(weight), autocast_low(bias));
  const char* op = "linear";
  check_operands(op, x, weight, "input", "weight");
  check_dim(op, weight, 2, "weight");
  MG_CHECK(x.dim() >= 1, "linear: the input needs at least 1 dimension, got shape ", shape_str(x.shape()));
  const int64_t in = weight.size(1), out_features = weight.size(0);
  MG_CHECK(x.size(-1) == in, "linear: input features ", x.size(-1), " do not match the weight's ", in,
           " (input ", shape_str(x.shape()), ", weight ", shape_str(weight.shape()), " = (out, in))");
  if (bias.defined()) {
    check_same_device(op, x, bias);
    check_same_dtype(op, x, bias);
    MG_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: bias must have shape (", out_features,
             "), got ", shape_str(bias.shape()));
  }
  OpNameGuard name(op);
  Shape shape = x.shape();
  shape.back() = out_features;
  Tensor out = empty(shape, {.dtype = x.dtype(), .device = x.device()});  // (..., out)
  if (out.numel() > 0) {  // on meta too: the workspace the kernel would take is allocated there
    const int64_t rows = out.numel() / out_features;
    Tensor x2;
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);  // only if x's rows cannot be flattened
      x2 = reshape(x.detach(), {rows, in});              // (R, in)
    }
    Tensor out2 = out.as_strided({rows, out_features}, {out_features, 1}, out.storage_offset());  // (R, out)
    run_product(out2, x2, transpose(weight.detach(), 0, 1), bias);
  }
  if (auto node = make_node_if_needed<LinearBackward>({x, weight, bias}, x.shape())) {
    if (weight.requires_grad()) node->x.save(x);
    if (x.requires_grad()) node->weight.save(weight);
    set_history(node, {x, weight, bias}, {out});
  }
  return out;
}

}  // namespace mg
