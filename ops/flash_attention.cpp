// Flash-style attention on the CPU (Dao et al. 2022): scores are made 64 x 64 tiles at a time
// (T x T when T < 64) and never held whole. Forward: per block of query rows, an online softmax over key tiles keeps the
// running row max m and sum l and rescales the output rows; it saves the output and the row
// log-sum-exp lse = m + log l, (B, NH, T). Backward recomputes each tile's weights from lse:
// P = exp(q k^T scale - lse), dv += Pd^T dout, dS = P * (dP * z - D) * scale with dP = dout v^T and
// D = rowsum(dout * out), dq += dS k, dk += dS^T q. The dropout factors z are regenerated from the
// Philox stream with the math path's rule (ops/attention_common.h), so both give the same result.
// On cuda:N the same function and node run the kernels of ops/cuda/flash_attention.cu: the same
// saved tensors, FLOP counts and memory categories; the lanes' workspace below is the CPU's
// (a meta step models it), where CUDA's blocks use shared memory and backward takes a (B, NH, T)
// workspace for D instead.
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
#include "ops/attention_tiles.h"
#include "ops/cuda/launchers.h"
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

// Note [Transposed score tiles]. The kernels hold a tile of scores transposed, keys down and
// queries across: ST[j][r] = sum_x k[j][x] (scale q[r][x]), from the query block packed once as
// QT[x][r] = scale q[r][x] (and, in backward, dout's block as dOT). Then every per-query quantity
// (running max, sum, lse, D) is a row of lanes, so the softmax steps vectorise over queries, and
// every product is a tile_gemm (ops/attention_tiles.h) reading its A operand at strides: P v as
// sum_j ST[j][r] v[j], dv += ST dout, dq += dS k as sum_j dST[j][r] k[j], dk += dST q.
// Masked (causal) entries are -inf before the max and 0 after the exponential.

// One lane's forward workspace: the query block transposed, a score tile, the running max and sum.
int64_t forward_ws(const FlashDims& d) { return d.HS * d.bs() + d.bs() * d.bs() + 2 * d.bs(); }

// QT[x * BS + r] = scale * src[r * st + x] for r < rows, x < HS.
template <class C>
void pack_transposed(const C* src, int64_t st, int64_t rows, int64_t HS, C scale, C* QT, int64_t BS) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < HS; ++x) QT[x * BS + r] = scale * src[r * st + x];
}

// D[r] = sum_x a[r][x] b[r][x], x in order (a plain loop's bits), 8 rows' chains advancing
// together so that they do not wait on one another's adds.
template <class C>
void row_dots(const C* a, int64_t sa, const C* b, int64_t sb, int64_t rows, int64_t n, C* D) {
  constexpr int64_t kRowsAtOnce = 8;
  int64_t r0 = 0;
  for (; r0 + kRowsAtOnce <= rows; r0 += kRowsAtOnce) {
    C acc[kRowsAtOnce] = {};
    for (int64_t x = 0; x < n; ++x)
#pragma GCC unroll 8
      for (int64_t q = 0; q < kRowsAtOnce; ++q) acc[q] += a[(r0 + q) * sa + x] * b[(r0 + q) * sb + x];
    std::copy(acc, acc + kRowsAtOnce, D + r0);
  }
  for (; r0 < rows; ++r0) {
    C acc = 0;
    for (int64_t x = 0; x < n; ++x) acc += a[r0 * sa + x] * b[r0 * sb + x];
    D[r0] = acc;
  }
}

// Whether key tile j0 reaches past the block's first query (causal: some entries are masked).
bool straddles(const FlashDims& d, int64_t i0, int64_t j0, int64_t cols) { return d.causal && j0 + cols - 1 > i0; }

// In a straddling tile, ST[j][r] = `value` where key j0 + j comes after query i0 + r.
template <class C>
void mask_future(C* ST, int64_t BS, int64_t i0, int64_t j0, int64_t rows, int64_t cols, C value) {
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t r = 0; r < std::min(rows, j0 + j - i0); ++r) ST[j * BS + r] = value;
}

template <class C>
void forward_kernel(const FlashDims& d, Operand<const C> q, Operand<const C> k, Operand<const C> v, Operand<C> out,
                    C* lse, C* ws) {
  using attention_tiles::tile_gemm;
  const int64_t T = d.T, HS = d.HS, BS = d.bs(), NB = d.blocks();
  const Generator g(d.drop.seed);
  on_lanes(d.S() * NB, forward_ws(d), ws, [&](int64_t task, C* w) {
    const int64_t s = task / NB, i0 = (task % NB) * BS, rows = std::min(BS, T - i0);
    C *QT = w, *ST = QT + HS * BS, *m = ST + BS * BS, *l = m + BS;
    C mx[kBlock], sum[kBlock], corr[kBlock];  // this tile's per-query max, sum, and the rescaling
    const C *ks = k.slice(s, d.NH), *vs = v.slice(s, d.NH);
    C* os = out.slice(s, d.NH) + i0 * out.st;
    pack_transposed(q.slice(s, d.NH) + i0 * q.st, q.st, rows, HS, C(d.scale), QT, BS);
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(os + r * out.st, os + r * out.st + HS, C(0));
      m[r] = -std::numeric_limits<C>::infinity();
      l[r] = 0;
    }
    const int64_t jend = d.causal ? i0 + rows : T;
    for (int64_t j0 = 0; j0 < jend; j0 += BS) {
      const int64_t cols = std::min(BS, jend - j0);
      tile_gemm(cols, rows, HS, ks + j0 * k.st, k.st, int64_t(1), QT, BS, ST, BS, false);  // (cols, rows) scores
      const bool masked = straddles(d, i0, j0, cols);
      if (masked) mask_future(ST, BS, i0, j0, rows, cols, -std::numeric_limits<C>::infinity());
      std::copy(m, m + rows, mx);
      for (int64_t j = 0; j < cols; ++j) {
        const C* row = ST + j * BS;
#pragma omp simd simdlen(16)
        for (int64_t r = 0; r < rows; ++r) mx[r] = mx[r] < row[r] ? row[r] : mx[r];
      }
      std::fill(sum, sum + rows, C(0));
      for (int64_t j = 0; j < cols; ++j) {  // each query's sum adds its keys in order
        C* row = ST + j * BS;
#pragma omp simd simdlen(16)
        for (int64_t r = 0; r < rows; ++r) {
          row[r] = fn::exp(row[r] - mx[r]);
          sum[r] += row[r];
        }
      }
      if (masked) mask_future(ST, BS, i0, j0, rows, cols, C(0));
      for (int64_t r = 0; r < rows; ++r) {
        corr[r] = fn::exp(m[r] - mx[r]);  // 0 on the first tile (m = -inf)
        l[r] = l[r] * corr[r] + sum[r];
        m[r] = mx[r];
      }
      for (int64_t r = 0; r < rows; ++r)
        if (corr[r] != C(1)) {
          C* orow = os + r * out.st;
          for (int64_t x = 0; x < HS; ++x) orow[x] *= corr[r];
        }
      if (d.drop.p > 0)
        for (int64_t j = 0; j < cols; ++j)
          for (int64_t r = 0; r < rows; ++r) ST[j * BS + r] *= drop_factor<C>(d, g, s, i0 + r, j0 + j);
      tile_gemm(rows, HS, cols, ST, int64_t(1), BS, vs + j0 * v.st, v.st, os, out.st, true);  // out += P v
    }
    for (int64_t r = 0; r < rows; ++r) {
      C* orow = os + r * out.st;
      const C inv = C(1) / l[r];
      for (int64_t x = 0; x < HS; ++x) orow[x] *= inv;
      lse[s * T + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

// One lane's backward workspace: q's and dout's blocks transposed, the weights tile, the dP / dS
// tile, the dropped weights tile, D of a query block.
int64_t backward_ws(const FlashDims& d) { return 2 * d.HS * d.bs() + 3 * d.bs() * d.bs() + d.bs(); }

// Null dq / dk / dv operands are not computed (v is read only when dq or dk is wanted).
template <class C>
void backward_kernel(const FlashDims& d, Operand<const C> q, Operand<const C> k, Operand<const C> v,
                     Operand<const C> out, const C* lse, Operand<const C> dout, Operand<C> dq, Operand<C> dk,
                     Operand<C> dv, C* ws) {
  using attention_tiles::tile_gemm;
  const int64_t T = d.T, HS = d.HS, BS = d.bs();
  const Generator g(d.drop.seed);
  const bool want_ds = dq.p || dk.p;
  on_lanes(d.S(), backward_ws(d), ws, [&](int64_t s, C* w) {
    C *QT = w, *dOT = QT + HS * BS, *PT = dOT + HS * BS, *dST = PT + BS * BS, *PdT = dST + BS * BS, *D = PdT + BS * BS;
    const C *qs = q.slice(s, d.NH), *ks = k.slice(s, d.NH), *vs = v.slice(s, d.NH);
    const C *os = out.slice(s, d.NH), *gs = dout.slice(s, d.NH);
    for (const Operand<C>* o : {&dq, &dk, &dv})
      if (o->p)
        for (int64_t t = 0; t < T; ++t) std::fill(o->slice(s, d.NH) + t * o->st, o->slice(s, d.NH) + t * o->st + HS, C(0));
    for (int64_t i0 = 0; i0 < T; i0 += BS) {
      const int64_t rows = std::min(BS, T - i0);
      const C* ls = lse + s * T + i0;
      pack_transposed(qs + i0 * q.st, q.st, rows, HS, C(d.scale), QT, BS);
      if (want_ds) pack_transposed(gs + i0 * dout.st, dout.st, rows, HS, C(1), dOT, BS);
      row_dots(gs + i0 * dout.st, dout.st, os + i0 * out.st, out.st, rows, HS, D);
      const int64_t jend = d.causal ? i0 + rows : T;
      for (int64_t j0 = 0; j0 < jend; j0 += BS) {
        const int64_t cols = std::min(BS, jend - j0);
        const bool masked = straddles(d, i0, j0, cols);
        tile_gemm(cols, rows, HS, ks + j0 * k.st, k.st, int64_t(1), QT, BS, PT, BS, false);
        for (int64_t j = 0; j < cols; ++j) {
          C* row = PT + j * BS;
#pragma omp simd simdlen(16)
          for (int64_t r = 0; r < rows; ++r) row[r] = fn::exp(row[r] - ls[r]);
        }
        if (masked) mask_future(PT, BS, i0, j0, rows, cols, C(0));
        const C* used = PT;  // the weights the forward multiplied v with
        if (d.drop.p > 0) {
          for (int64_t j = 0; j < cols; ++j)
            for (int64_t r = 0; r < rows; ++r) PdT[j * BS + r] = PT[j * BS + r] * drop_factor<C>(d, g, s, i0 + r, j0 + j);
          used = PdT;
        }
        if (dv.p)  // dv += P^T dout
          tile_gemm(cols, HS, rows, used, BS, int64_t(1), gs + i0 * dout.st, dout.st, dv.slice(s, d.NH) + j0 * dv.st,
                    dv.st, true);
        if (!want_ds) continue;
        tile_gemm(cols, rows, HS, vs + j0 * v.st, v.st, int64_t(1), dOT, BS, dST, BS, false);  // dP^T
        for (int64_t j = 0; j < cols; ++j) {
          C* drow = dST + j * BS;
          const C* prow = PT + j * BS;
          if (d.drop.p > 0)
            for (int64_t r = 0; r < rows; ++r) drow[r] *= drop_factor<C>(d, g, s, i0 + r, j0 + j);
#pragma omp simd simdlen(16)
          for (int64_t r = 0; r < rows; ++r) drow[r] = prow[r] * (drow[r] - D[r]) * C(d.scale);
        }
        if (masked) mask_future(dST, BS, i0, j0, rows, cols, C(0));
        if (dq.p)  // dq += dS k
          tile_gemm(rows, HS, cols, dST, int64_t(1), BS, ks + j0 * k.st, k.st, dq.slice(s, d.NH) + i0 * dq.st, dq.st,
                    true);
        if (dk.p)  // dk += dS^T q
          tile_gemm(cols, HS, rows, dST, BS, int64_t(1), qs + i0 * q.st, q.st, dk.slice(s, d.NH) + j0 * dk.st, dk.st,
                    true);
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

// The lane workspace of a kernel: shapes only decide its size (Note [Attention lanes]). None on
// cuda:N, whose kernels keep their tiles in shared memory.
Tensor lane_workspace(const FlashDims& d, int64_t tasks, int64_t per_lane, DType c, Device dev) {
  if (dev.is_cuda()) return Tensor();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  return empty({std::min(kLanes, std::max<int64_t>(tasks, 1)), per_lane}, {.dtype = c, .device = dev});
}

// The same dims for the CUDA kernels (ops/cuda/flash_attention.cu).
cuda::FlashAttentionDims cuda_dims(const FlashDims& d) {
  return {.B = d.B, .NH = d.NH, .T = d.T, .HS = d.HS, .causal = d.causal, .scale = d.scale, .p = d.drop.p,
          .seed = d.drop.seed, .offset = d.drop.offset};
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
    if (out_t.device().is_cuda()) {
      // D = rowsum(dout * out) (B, NH, T), read by the dq and the dk kernels.
      Tensor dsum = want_ds ? empty({d_.B, d_.NH, d_.T}, {.dtype = c, .device = out_t.device()}) : Tensor();
      cuda::flash_attention_backward(cuda_dims(d_), qc, kc, vc, oc, lse_t, gc, dsum, dqc, dkc, dvc);
    } else if (c == DType::f64) {
      run(0.0);
    } else {
      run(0.0f);
    }
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
      if (q.device().is_cuda()) cuda::flash_attention_forward(cuda_dims(d), qc, kc, vc, oc, lse);
      else if (c == DType::f64) run(0.0);
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
