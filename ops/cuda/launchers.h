// Host entry points of the CUDA kernels of ops/ (implemented in ops/cuda/*.cu, library mg_cuda).
// Plain C++, no CUDA headers, declared in every build: the op files call these where a tensor
// lives on cuda:N, with no preprocessor; a build without CUDA links ops/cuda_launcher_stub.cpp,
// whose launchers throw "<op>: tensor on cuda:N but this memgrad was built without CUDA". Each
// launcher expects what its op file already checked (shapes, dtypes, one device) and allocated
// (outputs), and checks every CUDA status itself.
// The functor of ops/kernels/elementwise_functors.h behind each code is named next to it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/cuda/backend.h"
#include "core/tensor.h"

namespace mg::cuda {

// ---- element-wise (elementwise_*.cu) ----------------------------------------------------------
enum class UnaryOp : uint8_t { neg, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu, relu6, gelu_tanh, silu };
// Forward ops (fn::Add ...), the scalar-first forms rsub (s - a) and rdiv (s / a) of
// binary_scalar, and the backward functors: out = fn::XBackward(dout, saved).
enum class BinaryOp : uint8_t {
  add, sub, mul, div, pow, maximum, minimum, rsub, rdiv,
  exp_backward, log_backward, sqrt_backward, rsqrt_backward, abs_backward, tanh_backward,
  sigmoid_backward, relu_backward, relu6_backward, gelu_tanh_backward, silu_backward,
};
enum class CompareOp : uint8_t { eq, ne, lt, le, gt, ge };

// out: contiguous, the broadcast shape; inputs: any strides, broadcastable to it, one dtype.
void unary(UnaryOp op, const Tensor& out, const Tensor& x);                       // out = f(x)
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);    // out = f(a, b)
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s);    // out = f(a, s)
void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b);  // out bool
void compare_scalar(CompareOp op, const Tensor& out, const Tensor& a, double s);  // compared in f64
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- reductions (reduce.cu) -------------------------------------------------------------------
// out (contiguous, the kept dims in order) = sum of x over the dims where reduced[d].
void sum(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
// Max over `dim` (NaN wins, the first maximum's index): values (x's dtype) and/or indices (i64),
// each contiguous with x's shape minus dim, either may be undefined.
void amax(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim);
// loss: () = mean((a - b)^2) for contiguous a, b of one shape (NaN for no elements).
void mse_loss(const Tensor& loss, const Tensor& a, const Tensor& b);

// ---- softmax (softmax.cu): x, y contiguous, viewed as (outer, n, inner) around the dim ----------
void softmax_forward(const Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool log);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, int64_t outer, int64_t n,
                      int64_t inner, bool log);

// ---- cross entropy (loss.cu): logits (N, C) any strides, target (N) i32/i64 -----------------------
// Checks every target is in [0, C) or ignore_index (an error names the first bad position) and
// returns how many are not ignored.
int64_t cross_entropy_count(const Tensor& target, int64_t C, int64_t ignore_index);
// loss () = sum(lse - x[target]) / count (0 when count is 0); lse (N) in f32 (f64 for f64).
void cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           int64_t ignore_index, int64_t count);
// dx (N, C) contiguous = (softmax - onehot) * dloss / count, read from dloss () on the device.
void cross_entropy_backward(const Tensor& dx, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            const Tensor& dloss, int64_t ignore_index, int64_t count);

// ---- layer_norm (layer_norm.cu): x, y, dy contiguous (M, C); w, b (C) or undefined -------------
void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& w,
                        const Tensor& b, double eps);
// dx, dw, db may each be undefined; partial sums for dw/db in workspace, added in a fixed order.
void layer_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                         const Tensor& mean, const Tensor& rstd, const Tensor& w);

// ---- batch_norm (batch_norm.cu): x contiguous, viewed as (N, C, S) ------------------------------------
// stats (2, C) f64: the batch mean and biased variance per channel, two-pass sums in f64.
void batch_norm_stats(const Tensor& stats, const Tensor& x, int64_t N, int64_t C, int64_t S);
// mean, rstd (C) in the stat dtype from stats (rstd = 1 / sqrt(var + eps)); when running_mean is
// defined, running = (1 - momentum) running + momentum batch, the variance times `unbias`.
void batch_norm_finish_stats(const Tensor& mean, const Tensor& rstd, const Tensor& stats, double eps,
                             const Tensor& running_mean, const Tensor& running_var, double momentum, double unbias);
// y = (x - mean) * rstd * w + b; w, b (C) or undefined.
void batch_norm_normalize(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                          const Tensor& b, int64_t N, int64_t C, int64_t S);
// dx, dw, db may each be undefined; dy contiguous like x.
void batch_norm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                         const Tensor& mean, const Tensor& rstd, const Tensor& w, int64_t N, int64_t C, int64_t S,
                         bool training);

// ---- matmul (matmul.cu): cuBLAS, f32 accumulation for f16/bf16, TF32 only if allow_tf32() ---------
// out (batch..., N, M) contiguous = a (..., N, K) b (..., K, M) (+ bias (M) on every row); a and b
// any strides (transposed views go to cuBLAS as transposed operands), batch dims broadcast.
void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias);

// ---- attention (attention.cu): the math path of ops/attention.cpp (scaled_dot_product_attention_math) ---
struct AttentionDims {
  int64_t S, T, HS;  // slices (B * NH), sequence length, head size
  bool causal;
  double scale;  // 1 / sqrt(HS)
  double p;      // dropout on the weights (0: none), mask = Philox(seed, offset + (s*T + i)*T + j)
  uint64_t seed, offset;
};
// q, k, v, out (S, T, HS); p, pd (S, T, T); all contiguous in the compute dtype (f32 or f64).
// p = softmax(scale q k^T, causal), pd = dropout(p) (undefined when d.p == 0), out = (pd or p) v.
void attention_forward(const AttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p,
                       const Tensor& pd, const Tensor& out);
// From p and dout: dv = pd^T dout, dS = p * (dP - rowsum(p dP)) * scale with dP = dout v^T (in buf
// (S, T, T)), dq = dS k, dk = dS^T q. Undefined outputs are not computed (nor their inputs read).
void attention_backward(const AttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p,
                        const Tensor& dout, const Tensor& buf, const Tensor& dq, const Tensor& dk, const Tensor& dv);

// ---- flash attention (flash_attention.cu): the tiled path of ops/flash_attention.cpp, the default -----
struct FlashAttentionDims {
  int64_t B, NH, T, HS;
  bool causal;
  double scale;  // 1 / sqrt(HS)
  double p;      // dropout on the weights (0: none), mask = Philox(seed, offset + (s*T + i)*T + j)
  uint64_t seed, offset;
};
// q, k, v, out (B, NH, T, HS): any strides with a contiguous last dimension; lse (B, NH, T)
// contiguous; all in the compute dtype (f32 or f64); HS <= 128 (else an error). out = (dropped)
// softmax(scale q k^T, causal) v and lse its rows' log-sum-exp, with no (T, T) buffer.
void flash_attention_forward(const FlashAttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse);
// From out, lse and dout (laid out as q): dq, dk, dv, each undefined when not wanted (nor computed);
// v and dsum (B, NH, T) contiguous, where D = rowsum(dout * out) goes, only needed for dq or dk.
// Deterministic: each gradient row is written by one block, no atomics.
void flash_attention_backward(const FlashAttentionDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dsum,
                              const Tensor& dq, const Tensor& dk, const Tensor& dv);

// ---- pooling (pool.cu): x, out, dout, dx contiguous (N, C, H, W) ----------------------------------------
struct Pool2dGeom {
  int64_t N, C, H, W, k, s, p, OH, OW;
};
// idx (N, C, OH, OW) i32 or undefined: the winner's h * W + w in its plane (NaN wins, then the first max).
void max_pool2d_forward(const Pool2dGeom& g, const Tensor& x, const Tensor& out, const Tensor& idx);
void max_pool2d_backward(const Pool2dGeom& g, const Tensor& dout, const Tensor& idx, const Tensor& dx);
void avg_pool2d_forward(const Pool2dGeom& g, const Tensor& x, const Tensor& out);  // count_include_pad
void avg_pool2d_backward(const Pool2dGeom& g, const Tensor& dout, const Tensor& dx);
void global_avg_pool2d_forward(const Tensor& x, const Tensor& out);    // (N, C, H, W) -> (N, C)
void global_avg_pool2d_backward(const Tensor& dout, const Tensor& dx);  // (N, C) -> (N, C, H, W)

// ---- conv2d (conv2d.cu): cuDNN, any groups; all operands contiguous NCHW -----------------------------------
struct Conv2dGeom {
  int64_t N, Cin, H, W, Cout, KH, KW, OH, OW, stride, pad, groups;
};
// The algorithm is the fastest by cuDNN's heuristics whose workspace fits what the device's budget
// leaves (1 GiB at most without a budget); the workspace is a tensor tagged workspace.
void conv2d_forward(const Conv2dGeom& g, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
// dx, dw, db may each be undefined (x is read for dw, w for dx); deterministic algorithms only.
void conv2d_backward(const Conv2dGeom& g, const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                     const Tensor& dw, const Tensor& db);
bool have_cudnn();  // false when this build found no cuDNN (conv2d on cuda:N is then an error)

// ---- embedding (embedding.cu): idx contiguous i32/i64 --------------------------------------------------
// Throws naming the first index outside [0, V) and its position.
void check_indices(const Tensor& idx, int64_t V, const Tensor& weight);
void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& idx);  // out (n, C) contiguous
// dweight (V, C) contiguous = scatter-add of g (n, C) contiguous; deterministic (stable sort by row).
void embedding_backward(const Tensor& dweight, const Tensor& g, const Tensor& idx);

// ---- dropout (dropout.cu): the CPU's mask, Philox(seed, offset + i); x, out contiguous ----------------
void dropout(const Tensor& out, const Tensor& x, uint64_t seed, uint64_t offset, double p);

// ---- fused optimizer updates (optim.cu), for optim/ to call: all contiguous, one device -------------
// w: the working weights (the parameter, or its f32 master of a 16-bit parameter, then `param` is
// the 16-bit parameter that receives the rounded result; else param is undefined).
struct AdamStep {
  double lr, weight_decay, beta1, beta2, eps, bias_correction1, bias_correction2_sqrt;
  bool decoupled;  // AdamW
};
void adam_step(const Tensor& w, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& param, const AdamStep& s);
struct SgdStep {
  double lr, weight_decay, momentum, dampening;
  bool nesterov, first;  // first: the momentum buffer starts as the gradient
};
void sgd_step(const Tensor& w, const Tensor& grad, const Tensor& momentum_buffer, const Tensor& param,
              const SgdStep& s);

}  // namespace mg::cuda
