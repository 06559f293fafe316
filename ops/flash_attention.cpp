// Flash-style attention on the CPU (Dao et al. 2022): scores are made 64 x 64 tiles at a time
// (T x T when T < 64) and never held whole. Forward: per block of query rows, an online softmax over key tiles keeps the
// running row max m and sum l and rescales the output rows; it saves the output and the row
// log-sum-exp lse = m + log l, (B, NH, T). Backward recomputes each tile's weights from lse:
// P = exp(q k^T scale - lse), dv += Pd^T dout, dS = P * (dP * z - D) * scale with dP = dout v^T and
// D = rowsum(dout * out), dq += dS k, dk += dS^T q. The dropout factors z are regenerated from the
// Philox stream with the math path's rule (ops/attention_common.h), so both give the same result.
//
// Note [Attention lanes]: tiles run on a fixed number of lanes (kLanes, fewer when there is less
// work), each with its own tile workspace from the allocator; tasks are dealt to lanes by index, so
// memory and results depend on the shapes only, never on the thread count. Forward tasks are
// (slice, query block) pairs; backward tasks are whole slices (dk, dv sum over query blocks).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "ops/attention_common.h"
#include "ops/cpu_gemm.h"
#include "ops/kernels/elementwise_functors.h"
#include "core/flop_counter.h"
#include "core/parallel.h"

namespace mg {
namespace {

using attention_detail::as_compute;
using attention_detail::compute_dtype;
using attention_detail::compute_target;
using attention_detail::finish;

constexpr int64_t kBlock = 64;  // query rows and key columns per tile
constexpr int64_t kLanes = 16;  // Note [Attention lanes]

struct FlashDims {
  int64_t B, NH, T, HS;
  bool causal;
  double scale;  // 1 / sqrt(HS)
  attention_detail::DropoutDraw drop;
  int64_t S() const { return B * NH; }
  int64_t bs() const { return std::clamp<int64_t>(T, 1, kBlock); }  // tile side: shorter for short T
  int64_t blocks() const { return (T + bs() - 1) / bs(); }
};

// A (B, NH, T, HS) operand with a contiguous last dimension: element (b, h, t, x) at
// p[b*sb + h*sh + t*st + x]. slice(s) points at (b, h) = (s / NH, s % NH).
template <class C>
struct Operand {
  C* p = nullptr;
  int64_t sb = 0, sh = 0, st = 0;
  C* slice(int64_t s, int64_t NH) const { return p + (s / NH) * sb + (s % NH) * sh; }
};
template <class C>
Operand<C> operand(const Tensor& t) {
  if (!t.defined()) return {};
  return {t.data<std::remove_const_t<C>>(), t.stride(0), t.stride(1), t.stride(2)};
}

// Key columns of query row i inside the key tile starting at j0 with `cols` columns.
int64_t valid_cols(const FlashDims& d, int64_t i, int64_t j0, int64_t cols) {
  return d.causal ? std::clamp<int64_t>(i - j0 + 1, 0, cols) : cols;
}

template <class C>
C drop_factor(const FlashDims& d, const Generator& g, int64_t s, int64_t i, int64_t j) {
  const uint64_t pos = d.drop.offset + uint64_t((s * d.T + i) * d.T + j);
  return g.uniform_at(pos) >= float(d.drop.p) ? C(1.0 / (1.0 - d.drop.p)) : C(0);
}

// Runs task(t, lane workspace) for t in [0, tasks) on min(kLanes, tasks) lanes of ws_per_lane.
template <class C, class F>
void on_lanes(int64_t tasks, int64_t ws_per_lane, C* ws, F task) {
  const int64_t lanes = std::min(kLanes, tasks);
  parallel_for(0, lanes, 1, [&](int64_t lb, int64_t le) {
    for (int64_t lane = lb; lane < le; ++lane)
      for (int64_t t = lane; t < tasks; t += lanes) task(t, ws + lane * ws_per_lane);
  });
}

// One lane's forward workspace: a score tile and the running max and sum of its rows.
int64_t forward_ws(const FlashDims& d) { return d.bs() * d.bs() + 2 * d.bs(); }

// max(init, row[0..n)): max is exact whatever the order, so 16 running maxima (which vectorise)
// give what one running maximum did (NaN aside, which has no meaning here).
template <class C>
C row_max(const C* row, int64_t n, C init) {
  constexpr int64_t kW = 16;
  C part[kW];
  std::fill(part, part + kW, init);
  int64_t j = 0;
  for (; j + kW <= n; j += kW)
    for (int64_t q = 0; q < kW; ++q) part[q] = part[q] < row[j + q] ? row[j + q] : part[q];
  C mx = init;
  for (int64_t q = 0; q < kW; ++q) mx = std::max(mx, part[q]);
  for (; j < n; ++j) mx = std::max(mx, row[j]);
  return mx;
}

// Note [Attention row sums]: sum[r] = row r's elements added left to right, as a single loop
// adds them, so the bits are a plain loop's; but 8 rows' chains advance together (one add per
// row per column) instead of one chain at a time, which waits on the adder's latency. The zeros
// after a row's valid columns add +0.0 to a non-negative sum: no change.
template <class C>
void row_sums(const C* tile, int64_t ld, int64_t rows, int64_t cols, C* sum) {
  constexpr int64_t kRows = 8;
  int64_t r0 = 0;
  for (; r0 + kRows <= rows; r0 += kRows) {
    C acc[kRows] = {};
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t q = 0; q < kRows; ++q) acc[q] += tile[(r0 + q) * ld + j];
    std::copy(acc, acc + kRows, sum + r0);
  }
  for (; r0 < rows; ++r0) {
    C acc = 0;
    for (int64_t j = 0; j < cols; ++j) acc += tile[r0 * ld + j];
    sum[r0] = acc;
  }
}

template <class C>
void forward_kernel(const FlashDims& d, Operand<const C> q, Operand<const C> k, Operand<const C> v, Operand<C> out,
                    C* lse, C* ws) {
  const int64_t T = d.T, HS = d.HS, BS = d.bs(), NB = d.blocks();
  const Generator g(d.drop.seed);
  on_lanes(d.S() * NB, forward_ws(d), ws, [&](int64_t task, C* w) {
    const int64_t s = task / NB, i0 = (task % NB) * BS, rows = std::min(BS, T - i0);
    C *tile = w, *m = w + BS * BS, *l = m + BS;
    C mx[kBlock], sum[kBlock];  // this tile's row maxima and sums
    const C *qs = q.slice(s, d.NH) + i0 * q.st, *ks = k.slice(s, d.NH), *vs = v.slice(s, d.NH);
    C* os = out.slice(s, d.NH) + i0 * out.st;
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(os + r * out.st, os + r * out.st + HS, C(0));
      m[r] = -std::numeric_limits<C>::infinity();
      l[r] = 0;
    }
    const int64_t jend = d.causal ? i0 + rows : T;
    for (int64_t j0 = 0; j0 < jend; j0 += BS) {
      const int64_t cols = std::min(BS, jend - j0);
      cpu_gemm(Transpose::no, Transpose::yes, rows, cols, HS, C(d.scale), qs, q.st, ks + j0 * k.st, k.st, C(0), tile,
               BS);  // (rows, cols) scores
      // Each row: its new max, e^(s - max) over the valid columns and zeros after them; then the
      // rows' sums 8 rows at a time (Note [Attention row sums]); then rescaling and dropout.
      for (int64_t r = 0; r < rows; ++r) {
        C* row = tile + r * BS;
        const int64_t L = valid_cols(d, i0 + r, j0, cols);
        mx[r] = row_max(row, L, m[r]);
        for (int64_t j = 0; j < L; ++j) row[j] = fn::exp(row[j] - mx[r]);  // vectorises
        std::fill(row + L, row + cols, C(0));
      }
      row_sums(tile, BS, rows, cols, sum);
      for (int64_t r = 0; r < rows; ++r) {
        C* row = tile + r * BS;
        const int64_t L = valid_cols(d, i0 + r, j0, cols);
        const C corr = fn::exp(m[r] - mx[r]);  // 0 on the first tile (m = -inf)
        l[r] = l[r] * corr + sum[r];
        m[r] = mx[r];
        if (corr != C(1)) {
          C* orow = os + r * out.st;
          for (int64_t x = 0; x < HS; ++x) orow[x] *= corr;
        }
        if (d.drop.p > 0)
          for (int64_t j = 0; j < L; ++j) row[j] *= drop_factor<C>(d, g, s, i0 + r, j0 + j);
      }
      cpu_gemm(Transpose::no, Transpose::no, rows, HS, cols, C(1), tile, BS, vs + j0 * v.st, v.st, C(1), os,
               out.st);
    }
    for (int64_t r = 0; r < rows; ++r) {
      C* orow = os + r * out.st;
      const C inv = C(1) / l[r];
      for (int64_t x = 0; x < HS; ++x) orow[x] *= inv;
      lse[s * T + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

// One lane's backward workspace: the weights tile, the dP / dS tile, D of a query block.
int64_t backward_ws(const FlashDims& d) { return 2 * d.bs() * d.bs() + d.bs(); }

// Null dq / dk / dv operands are not computed (v is read only when dq or dk is wanted).
template <class C>
void backward_kernel(const FlashDims& d, Operand<const C> q, Operand<const C> k, Operand<const C> v,
                     Operand<const C> out, const C* lse, Operand<const C> dout, Operand<C> dq, Operand<C> dk,
                     Operand<C> dv, C* ws) {
  const int64_t T = d.T, HS = d.HS, BS = d.bs();
  const Generator g(d.drop.seed);
  const bool want_ds = dq.p || dk.p;
  on_lanes(d.S(), backward_ws(d), ws, [&](int64_t s, C* w) {
    C *P = w, *dS = w + BS * BS, *D = dS + BS * BS;
    const C *qs = q.slice(s, d.NH), *ks = k.slice(s, d.NH), *vs = v.slice(s, d.NH);
    const C *os = out.slice(s, d.NH), *gs = dout.slice(s, d.NH);
    for (const Operand<C>* o : {&dq, &dk, &dv})
      if (o->p)
        for (int64_t t = 0; t < T; ++t) std::fill(o->slice(s, d.NH) + t * o->st, o->slice(s, d.NH) + t * o->st + HS, C(0));
    for (int64_t i0 = 0; i0 < T; i0 += BS) {
      const int64_t rows = std::min(BS, T - i0);
      const C* ls = lse + s * T + i0;
      for (int64_t r = 0; r < rows; ++r) {
        const C *gr = gs + (i0 + r) * dout.st, *orow = os + (i0 + r) * out.st;
        C dot = 0;
        for (int64_t x = 0; x < HS; ++x) dot += gr[x] * orow[x];
        D[r] = dot;
      }
      const int64_t jend = d.causal ? i0 + rows : T;
      for (int64_t j0 = 0; j0 < jend; j0 += BS) {
        const int64_t cols = std::min(BS, jend - j0);
        cpu_gemm(Transpose::no, Transpose::yes, rows, cols, HS, C(d.scale), qs + i0 * q.st, q.st, ks + j0 * k.st, k.st,
                 C(0), P, BS);
        for (int64_t r = 0; r < rows; ++r) {
          C* row = P + r * BS;
          const int64_t L = valid_cols(d, i0 + r, j0, cols);
          for (int64_t j = 0; j < L; ++j) row[j] = fn::exp(row[j] - ls[r]);
          std::fill(row + L, row + cols, C(0));
        }
        if (dv.p) {
          const C* w_used = P;  // the weights the forward multiplied v with
          if (d.drop.p > 0) {
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < cols; ++j)
                dS[r * BS + j] = P[r * BS + j] * drop_factor<C>(d, g, s, i0 + r, j0 + j);
            w_used = dS;
          }
          cpu_gemm(Transpose::yes, Transpose::no, cols, HS, rows, C(1), w_used, BS, gs + i0 * dout.st, dout.st, C(1),
                   dv.slice(s, d.NH) + j0 * dv.st, dv.st);
        }
        if (!want_ds) continue;
        cpu_gemm(Transpose::no, Transpose::yes, rows, cols, HS, C(1), gs + i0 * dout.st, dout.st, vs + j0 * v.st, v.st,
                 C(0), dS, BS);  // dP
        for (int64_t r = 0; r < rows; ++r) {
          C *drow = dS + r * BS;
          const C* prow = P + r * BS;
          const int64_t L = valid_cols(d, i0 + r, j0, cols);
          if (d.drop.p > 0)
            for (int64_t j = 0; j < L; ++j) drow[j] *= drop_factor<C>(d, g, s, i0 + r, j0 + j);
          for (int64_t j = 0; j < L; ++j) drow[j] = prow[j] * (drow[j] - D[r]) * C(d.scale);
          std::fill(drow + L, drow + cols, C(0));
        }
        if (dq.p)
          cpu_gemm(Transpose::no, Transpose::no, rows, HS, cols, C(1), dS, BS, ks + j0 * k.st, k.st, C(1),
                   dq.slice(s, d.NH) + i0 * dq.st, dq.st);
        if (dk.p)
          cpu_gemm(Transpose::yes, Transpose::no, cols, HS, rows, C(1), dS, BS, qs + i0 * q.st, q.st, C(1),
                   dk.slice(s, d.NH) + j0 * dk.st, dk.st);
      }
    }
  });
}

// A (B, NH, T, HS) tensor laid out as (B, T, NH, HS): transposing it back and merging the heads,
// as a model does next, is a view instead of a copy.
Tensor empty_heads_last(const FlashDims& d, const TensorOptions& opt) {
  Tensor t = empty({d.B, d.T, d.NH, d.HS}, opt);
  return t.as_strided({d.B, d.NH, d.T, d.HS}, {d.T * d.NH * d.HS, d.HS, d.NH * d.HS, 1}, 0);
}

// The FLOPs of one pass over the scores, `products` (T, T, HS)-sized products per slice (forward:
// q k^T and P v; backward: the recomputed q k^T, dP, dv, dq, dk), half the scores when causal.
double attention_flops(const FlashDims& d, int products) {
  const double scores = double(d.T) * double(d.T) * (d.causal ? 0.5 : 1.0);
  return 2.0 * products * double(d.S()) * scores * double(d.HS);
}

// The lane workspace of a kernel: shapes only decide its size (Note [Attention lanes]).
Tensor lane_workspace(const FlashDims& d, int64_t tasks, int64_t per_lane, DType c, Device dev) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return empty({std::min(kLanes, std::max<int64_t>(tasks, 1)), per_lane}, {.dtype = c, .device = dev});
}

class FlashAttentionBackward : public Node {
 public:
  explicit FlashAttentionBackward(FlashDims d) : d_(d) {}
  std::string_view name() const override { return "FlashAttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor lse_t = lse.unpack(), out_t = out.unpack(), q_t = q.unpack();
    const DType dt = q_t.dtype(), c = compute_dtype(dt);  // gradients in the inputs' dtype
    const TensorOptions opt{.dtype = dt, .device = out_t.device()};
    Tensor dq = needs_input_grad(0) ? empty_heads_last(d_, opt) : Tensor();
    Tensor dk = needs_input_grad(1) ? empty_heads_last(d_, opt) : Tensor();
    Tensor dv = needs_input_grad(2) ? empty_heads_last(d_, opt) : Tensor();
    MemoryCategoryGuard ws_tag(MemoryCategory::workspace);
    const bool want_ds = dq.defined() || dk.defined();
    Tensor qc = as_compute(q_t, c, false), kc = as_compute(k.unpack(), c, false);
    Tensor vc = want_ds ? as_compute(v.unpack(), c, false) : Tensor();
    Tensor oc = as_compute(out_t, c, false), gc = as_compute(g[0], c, false);
    Tensor dqc = dq.defined() ? compute_target(dq, c) : Tensor();
    Tensor dkc = dk.defined() ? compute_target(dk, c) : Tensor();
    Tensor dvc = dv.defined() ? compute_target(dv, c) : Tensor();
    Tensor ws = lane_workspace(d_, d_.S(), backward_ws(d_), c, out_t.device());
    count_flops(FlopKind::gemm_f32, attention_flops(d_, 5));
    if (skip_kernel(out_t)) {  // meta (or empty): shapes and bytes only
      for (const Tensor& t : {dq, dk, dv})
        if (t.defined() && !t.is_meta()) fill_(t, 0.0);
      return {dq, dk, dv};
    }
    auto run = [&](auto zero) {
      using C = decltype(zero);
      backward_kernel<C>(d_, operand<const C>(qc), operand<const C>(kc), operand<const C>(vc), operand<const C>(oc),
                         lse_t.data<C>(), operand<const C>(gc), operand<C>(dqc), operand<C>(dkc), operand<C>(dvc),
                         ws.data<C>());
    };
    if (c == DType::f64) run(0.0);
    else run(0.0f);
    if (dq.defined()) finish(dq, dqc);
    if (dk.defined()) finish(dk, dkc);
    if (dv.defined()) finish(dv, dvc);
    return {dq, dk, dv};
  }
  // Saves q, k, v (views of what the caller holds: no new memory in a model), the output (an f32
  // copy when it is f16/bf16) and lse (B, NH, T) in the compute dtype: O(T) per row where the
  // math path keeps O(T^2).
  SavedTensor q{this}, k{this}, v{this}, out{this}, lse{this};

 private:
  FlashDims d_;
};

}  // namespace

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                       Generator* gen) {
  OpNameGuard name("scaled_dot_product_attention");
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  FlashDims d{.B = B, .NH = NH, .T = T, .HS = HS, .causal = causal,
              .scale = HS > 0 ? 1.0 / std::sqrt(double(HS)) : 1.0,
              .drop = attention_detail::reserve_dropout(dropout_p, gen, B * NH, T)};
  const bool record = any_requires_grad({q, k, v});
  const DType c = compute_dtype(q.dtype());
  Tensor out = empty_heads_last(d, {.dtype = q.dtype(), .device = q.device()});  // (B, NH, T, HS)
  Tensor lse;  // (B, NH, T) row log-sum-exp: saved, or scratch
  {
    std::optional<MemoryCategoryGuard> ws;
    if (!record) ws.emplace(MemoryCategory::workspace);
    lse = empty({B, NH, T}, {.dtype = c, .device = q.device()});
  }
  // The output in the compute dtype: `out` itself, else an f32 tensor that backward keeps for
  // D = rowsum(dout * out) (from a bf16-rounded output D loses the digits dS = P (dP - D) needs).
  Tensor oc = out;
  if (out.dtype() != c) {
    MemoryCategoryGuard tag(record ? MemoryCategory::activation : MemoryCategory::workspace);
    oc = empty(out.shape(), {.dtype = c, .device = q.device()});
  }
  {
    MemoryCategoryGuard ws_tag(MemoryCategory::workspace);
    Tensor qc = as_compute(q, c, false), kc = as_compute(k, c, false), vc = as_compute(v, c, false);
    Tensor ws = lane_workspace(d, d.S() * d.blocks(), forward_ws(d), c, q.device());
    count_flops(FlopKind::gemm_f32, attention_flops(d, 2));
    if (!skip_kernel(out)) {
      auto run = [&](auto zero) {
        using C = decltype(zero);
        forward_kernel<C>(d, operand<const C>(qc), operand<const C>(kc), operand<const C>(vc), operand<C>(oc),
                          lse.data<C>(), ws.data<C>());
      };
      if (c == DType::f64) run(0.0);
      else run(0.0f);
      finish(out, oc);
    }
  }
  if (record) {
    auto node = std::make_shared<FlashAttentionBackward>(d);
    node->q.save(q);
    node->k.save(k);
    node->v.save(v);
    node->out.save(oc);
    node->lse.save(lse);
    set_history(node, {q, k, v}, {out});
  }
  return out;
}

}  // namespace mg
