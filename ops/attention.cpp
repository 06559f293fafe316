// Scaled dot-product attention, the "math" path with materialised scores: the reference the
// tiled default (ops/flash_attention.cpp, on every device) is tested against. Per (batch, head)
// slice: S = q k^T / sqrt(HS) (T, T), causal mask (j > i dropped), softmax per row in f32 (f64
// for f64), optional dropout on the weights, out = P v. Products go through cpu_gemm: slices
// run in parallel with single-threaded GEMMs when small, else in turn with threaded GEMMs.
// Dropout keeps weight (s, i, j) iff uniform(seed, offset + (s*T + i)*T + j) >= p, offset
// reserved with gen->advance(S*T*T), the same rule as mg::dropout.
//
// AttentionBackward saves q (for dk), k (for dq), v (for dP = dout v^T), each only when that
// gradient is needed, and the attention weights P (B, NH, T, T) before dropout, in the input
// dtype (for dv = P^T dout and the softmax gradient). The dropout mask is not saved: it is
// recomputed from (seed, offset), two integers. Without a graph P lives in workspace memory.
// Called explicitly on cuda:N, the same steps run on strided-batched cuBLAS GEMMs (ops/cuda/attention.cu).
#include <cmath>
#include <limits>
#include <optional>

#include "core/rng.h"
#include "ops/attention_common.h"
#include "ops/autocast_policy.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/cpu_gemm.h"
#include "ops/cpu_loops.h"
#include "ops/cuda/launchers.h"
#include "ops/ops.h"

namespace mg {
namespace {

constexpr int64_t kSmallGemmMacs = int64_t(1) << 21;  // as in matmul.cpp

struct AttnDims {
  int64_t S, T, HS;  // slices (B * NH), sequence length, head size
  bool causal;
  double scale;      // 1 / sqrt(HS)
  double p = 0.0;    // dropout probability (0: none)
  uint64_t seed = 0, offset = 0;
  int64_t row_len(int64_t i) const { return causal ? i + 1 : T; }  // unmasked entries of row i
};

// fn(s) for every slice: parallel over slices with serial GEMMs when each is small, else in turn.
template <class F>
void for_each_slice(const AttnDims& d, F fn) {
  if (d.S > 1 && d.T * d.T * d.HS <= kSmallGemmMacs) {
    parallel_for(0, d.S, 1, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) fn(s);
    });
  } else {
    for (int64_t s = 0; s < d.S; ++s) fn(s);
  }
}

// fn(row, i) for every score row (row in [0, S*T), i its query position), in parallel.
template <class F>
void for_each_score_row(const AttnDims& d, F fn) {
  parallel_for(0, d.S * d.T, std::max<int64_t>(1, 16384 / d.T), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) fn(r, r % d.T);
  });
}

// The dropout factor of weight (row, j): 0 or 1/(1-p).
template <class C>
C drop_factor(const AttnDims& d, const Generator& g, int64_t row, int64_t j) {
  return g.uniform_at(d.offset + uint64_t(row * d.T + j)) >= float(d.p) ? C(1.0 / (1.0 - d.p)) : C(0);
}

// q, k, v (S, T, HS) -> p (S, T, T) softmax weights, pd (S, T, T) the same after dropout (only
// when d.p > 0), out (S, T, HS) = (pd or p) v. All contiguous, compute type C.
template <class C>
void forward_kernel(const AttnDims& d, const C* q, const C* k, const C* v, C* p, C* pd, C* out) {
  const int64_t T = d.T, HS = d.HS;
  for_each_slice(d, [&](int64_t s) {
    cpu_gemm(Transpose::no, Transpose::yes, T, T, HS, C(d.scale), q + s * T * HS, HS, k + s * T * HS, HS, C(0),
             p + s * T * T, T);
  });
  const Generator g(d.seed);
  for_each_score_row(d, [&](int64_t r, int64_t i) {
    C* row = p + r * T;
    const int64_t L = d.row_len(i);
    C mx = row[0];
    for (int64_t j = 1; j < L; ++j) mx = std::max(mx, row[j]);
    C sum = 0;
    for (int64_t j = 0; j < L; ++j) row[j] = fn::exp(row[j] - mx);  // vectorises; the sum stays in order
    for (int64_t j = 0; j < L; ++j) sum += row[j];
    for (int64_t j = 0; j < L; ++j) row[j] /= sum;
    std::fill(row + L, row + T, C(0));
    if (pd)
      for (int64_t j = 0; j < T; ++j) pd[r * T + j] = row[j] * drop_factor<C>(d, g, r, j);
  });
  const C* w = pd ? pd : p;
  for_each_slice(d, [&](int64_t s) {
    cpu_gemm(Transpose::no, Transpose::no, T, HS, T, C(1), w + s * T * T, T, v + s * T * HS, HS, C(0),
             out + s * T * HS, HS);
  });
}

// From p (S, T, T) and dout (S, T, HS): dv = pd^T dout, dP = dout v^T, dS = p * (dP - rowsum(p dP))
// * scale, dq = dS k, dk = dS^T q. buf (S, T, T) is scratch; null outputs are not computed.
template <class C>
void backward_kernel(const AttnDims& d, const C* q, const C* k, const C* v, const C* p, const C* dout, C* buf,
                     C* dq, C* dk, C* dv) {
  const int64_t T = d.T, HS = d.HS;
  const Generator g(d.seed);
  if (dv) {
    const C* w = p;
    if (d.p > 0) {  // the weights the forward multiplied v with
      for_each_score_row(d, [&](int64_t r, int64_t) {
        for (int64_t j = 0; j < T; ++j) buf[r * T + j] = p[r * T + j] * drop_factor<C>(d, g, r, j);
      });
      w = buf;
    }
    for_each_slice(d, [&](int64_t s) {
      cpu_gemm(Transpose::yes, Transpose::no, T, HS, T, C(1), w + s * T * T, T, dout + s * T * HS, HS, C(0),
               dv + s * T * HS, HS);
    });
  }
  if (!dq && !dk) return;
  for_each_slice(d, [&](int64_t s) {
    cpu_gemm(Transpose::no, Transpose::yes, T, T, HS, C(1), dout + s * T * HS, HS, v + s * T * HS, HS, C(0),
             buf + s * T * T, T);
  });
  for_each_score_row(d, [&](int64_t r, int64_t i) {
    C* row = buf + r * T;  // dP, becomes dS
    const C* pr = p + r * T;
    const int64_t L = d.row_len(i);
    if (d.p > 0)
      for (int64_t j = 0; j < L; ++j) row[j] *= drop_factor<C>(d, g, r, j);
    C dot = 0;
    for (int64_t j = 0; j < L; ++j) dot += pr[j] * row[j];
    for (int64_t j = 0; j < L; ++j) row[j] = pr[j] * (row[j] - dot) * C(d.scale);
    std::fill(row + L, row + T, C(0));
  });
  for_each_slice(d, [&](int64_t s) {
    if (dq)
      cpu_gemm(Transpose::no, Transpose::no, T, HS, T, C(1), buf + s * T * T, T, k + s * T * HS, HS, C(0),
               dq + s * T * HS, HS);
    if (dk)
      cpu_gemm(Transpose::yes, Transpose::no, T, HS, T, C(1), buf + s * T * T, T, q + s * T * HS, HS, C(0),
               dk + s * T * HS, HS);
  });
}

// The same dims for the CUDA kernels (ops/cuda/attention.cu).
cuda::AttentionDims cuda_dims(const AttnDims& d) {
  return {.S = d.S, .T = d.T, .HS = d.HS, .causal = d.causal, .scale = d.scale, .p = d.p, .seed = d.seed,
          .offset = d.offset};
}

using attention_detail::as_compute;
using attention_detail::compute_dtype;
using attention_detail::compute_target;
using attention_detail::finish;
using attention_detail::ptr_or_null;

class AttentionBackward : public Node {
 public:
  explicit AttentionBackward(AttnDims d) : d_(d) {}
  std::string_view name() const override { return "AttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor pv = att.unpack();
    const DType dt = pv.dtype(), c = compute_dtype(dt);
    const TensorOptions opt{.dtype = dt, .device = pv.device()};
    const Shape qshape = g[0].shape();  // (B, NH, T, HS)
    Tensor dq = needs_input_grad(0) ? empty(qshape, opt) : Tensor();
    Tensor dk = needs_input_grad(1) ? empty(qshape, opt) : Tensor();
    Tensor dv = needs_input_grad(2) ? empty(qshape, opt) : Tensor();
    if (skip_kernel(pv) || g[0].numel() == 0) {  // meta (or empty): shapes only
      for (const Tensor& t : {dq, dk, dv})
        if (t.defined() && !t.is_meta()) fill_(t, 0.0);
      return {dq, dk, dv};
    }
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    Tensor pc = as_compute(pv, c), gc = as_compute(g[0], c);
    Tensor qc = dk.defined() ? as_compute(q.unpack(), c) : Tensor();
    Tensor kc = dq.defined() ? as_compute(k.unpack(), c) : Tensor();
    Tensor vc = dq.defined() || dk.defined() ? as_compute(v.unpack(), c) : Tensor();
    Tensor buf = empty(pv.shape(), {.dtype = c, .device = pv.device()});  // (B, NH, T, T)
    Tensor dqc = dq.defined() ? compute_target(dq, c) : Tensor();
    Tensor dkc = dk.defined() ? compute_target(dk, c) : Tensor();
    Tensor dvc = dv.defined() ? compute_target(dv, c) : Tensor();
    auto run = [&](auto zero) {
      using C = decltype(zero);
      backward_kernel<C>(d_, ptr_or_null<C>(qc), ptr_or_null<C>(kc), ptr_or_null<C>(vc), pc.data<C>(), gc.data<C>(),
                         buf.data<C>(), ptr_or_null<C>(dqc), ptr_or_null<C>(dkc), ptr_or_null<C>(dvc));
    };
    if (pv.device().is_cuda()) cuda::attention_backward(cuda_dims(d_), qc, kc, vc, pc, gc, buf, dqc, dkc, dvc);
    else if (c == DType::f64) run(0.0);
    else run(0.0f);
    if (dq.defined()) finish(dq, dqc);
    if (dk.defined()) finish(dk, dkc);
    if (dv.defined()) finish(dv, dvc);
    return {dq, dk, dv};
  }
  SavedTensor q{this}, k{this}, v{this}, att{this};

 private:
  AttnDims d_;
};

}  // namespace

namespace attention_detail {

void check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_floating(op, q);
  check_dim(op, q, 4, "q (B, NH, T, HS)");
  MG_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op, ": q, k and v must have one shape (B, NH, T, HS), got ",
           shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  MG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ", dropout_p);
}

Tensor as_compute(const Tensor& t, DType c, bool contiguous_only) {
  const bool ok = contiguous_only ? t.is_contiguous() : (t.dim() == 0 || t.stride(t.dim() - 1) == 1);
  if (t.dtype() == c && ok) return t.detach();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  Tensor out = empty(t.shape(), {.dtype = c, .device = t.device()});
  copy_(out, t);
  return out;
}

Tensor compute_target(const Tensor& dst, DType c) {
  if (dst.dtype() == c) return dst;
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return empty(dst.shape(), {.dtype = c, .device = dst.device()});
}

void finish(const Tensor& dst, const Tensor& computed) {
  if (!computed.is_same(dst)) copy_(dst, computed);
}

DropoutDraw reserve_dropout(double p, Generator* gen, int64_t S, int64_t T) {
  if (p <= 0) return {};
  Generator& g = gen ? *gen : default_generator();
  const uint64_t seed = g.seed();
  return {.p = p, .seed = seed, .offset = g.advance(uint64_t(S * T * T))};  // reserved on meta too
}

}  // namespace attention_detail

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    Generator* gen) {
  if (autocast_wants_low({q, k, v}))
    return scaled_dot_product_attention(autocast_low(q), autocast_low(k), autocast_low(v), causal, dropout_p, gen);
  attention_detail::check_inputs("scaled_dot_product_attention", q, k, v, dropout_p);
  return flash_attention(q, k, v, causal, dropout_p, gen);  // cpu:N, meta and cuda:N alike
}

Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                         double dropout_p, Generator* gen) {
  if (autocast_wants_low({q, k, v}))
    return scaled_dot_product_attention_math(autocast_low(q), autocast_low(k), autocast_low(v), causal, dropout_p, gen);
  const char* op = "scaled_dot_product_attention";
  attention_detail::check_inputs(op, q, k, v, dropout_p);
  OpNameGuard name(op);
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  AttnDims d{.S = B * NH, .T = T, .HS = HS, .causal = causal, .scale = HS > 0 ? 1.0 / std::sqrt(double(HS)) : 1.0};
  const attention_detail::DropoutDraw draw = attention_detail::reserve_dropout(dropout_p, gen, d.S, T);
  d.p = draw.p, d.seed = draw.seed, d.offset = draw.offset;
  const bool record = any_requires_grad({q, k, v});
  const TensorOptions opt{.dtype = q.dtype(), .device = q.device()};
  Tensor out = empty(q.shape(), opt);  // (B, NH, T, HS)
  Tensor att;                          // (B, NH, T, T) softmax weights: saved, or scratch
  {
    std::optional<MemoryCategoryGuard> ws;
    if (!record) ws.emplace(MemoryCategory::workspace);
    att = empty({B, NH, T, T}, opt);
  }
  if (!skip_kernel(out) && T > 0) {
    const DType c = compute_dtype(q.dtype());
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    Tensor qc = as_compute(q, c), kc = as_compute(k, c), vc = as_compute(v, c);
    Tensor pc = compute_target(att, c), oc = compute_target(out, c);
    Tensor pd = d.p > 0 ? empty(att.shape(), {.dtype = c, .device = q.device()}) : Tensor();
    auto run = [&](auto zero) {
      using C = decltype(zero);
      forward_kernel<C>(d, qc.data<C>(), kc.data<C>(), vc.data<C>(), pc.data<C>(), ptr_or_null<C>(pd), oc.data<C>());
    };
    if (q.device().is_cuda()) cuda::attention_forward(cuda_dims(d), qc, kc, vc, pc, pd, oc);
    else if (c == DType::f64) run(0.0);
    else run(0.0f);
    finish(att, pc);
    finish(out, oc);
  }
  if (record) {
    auto node = std::make_shared<AttentionBackward>(d);
    if (k.requires_grad()) node->q.save(q);
    if (q.requires_grad()) node->k.save(k);
    if (q.requires_grad() || k.requires_grad()) node->v.save(v);
    node->att.save(att);
    set_history(node, {q, k, v}, {out});
  }
  return out;
}

}  // namespace mg
