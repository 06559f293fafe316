// The functional API: every differentiable operation on tensors. Each op checks its inputs
// (devices match, dtypes supported, shapes), infers the output shape, allocates it and runs the
// device kernel (on meta it stops after allocation), and records a backward Node when an input
// requires grad. Shapes are written next to each function.
#pragma once
#include <optional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace mg {

// ---- views and copies (view_ops.cpp) ---- share storage where the strides allow -------------
Tensor reshape(const Tensor& x, Shape shape);  // one dim may be -1; copies only if it must
Tensor view(const Tensor& x, Shape shape);     // like reshape, but an error if a copy would be needed
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);  // removes dim
Tensor expand(const Tensor& x, Shape shape);                 // -1 keeps a size
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor clone(const Tensor& x);       // always a fresh copy
Tensor to(const Tensor& x, Device device);  // differentiable move between devices
Tensor cast(const Tensor& x, DType dtype);  // differentiable dtype conversion (x itself if same)
inline Tensor to(const Tensor& x, DType dtype) { return cast(x, dtype); }

// ---- element-wise, broadcasting (elementwise.cpp) -------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // gradient goes to a where a >= b
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(double a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(double a, const Tensor& b);  // a / b
Tensor pow(const Tensor& a, double exponent);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor relu6(const Tensor& x);
Tensor gelu_tanh(const Tensor& x);  // GPT-2's GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
Tensor gelu_tanh_backward(const Tensor& dout, const Tensor& x);  // dout * gelu_tanh'(x), no graph
Tensor silu(const Tensor& x);

// Comparisons give bool tensors and no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
// cond ? a : b, broadcasting all three; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return rsub(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return rdiv(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

// ---- reductions (reduce.cpp) -----------------------------------------------------------------
// Empty `dims` reduces over every dimension. Float sums accumulate in f64 for f64 inputs and in
// f32 otherwise, in an order fixed by the shape (not by the thread count).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor amax(const Tensor& x, int64_t dim, bool keepdim = false);    // max values over dim
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64 indices, first max wins
Tensor max(const Tensor& x);                                        // over all elements, 0-d
// Sums `x` down to `shape` (the inverse of broadcasting): how broadcast gradients are reduced.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra (matmul.cpp) -------------------------------------------------------------
// a: (..., N, K), b: (..., K, M) -> (..., N, M), batch dims broadcast; 1-D operands as in NumPy.
Tensor matmul(const Tensor& a, const Tensor& b);
// x: (..., in), weight: (out, in), bias: (out) or undefined -> (..., out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// x: (..., H), weight: (out, H), bias: (out) -> (..., out) = linear(gelu_tanh(x), weight, bias),
// saving x (and weight) but not gelu_tanh(x): backward recomputes it (gelu_linear.cpp).
Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- softmax and losses (softmax.cpp, loss.cpp) ----------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// logits: (N, C), target: (N) i64/i32 class indices -> scalar mean over targets != ignore_index.
// Fused with log-softmax: saves only the logits' softmax statistics, never a (N, C) log-prob copy.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100);
// hidden: (N, C), weight: (V, C), target: (N) -> (); equals cross_entropy(linear(hidden, weight),
// target, ignore_index) without the (N, V) logits or their gradient ever whole (chunks of rows).
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& target,
                            int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target);  // mean of squared differences

// ---- normalisation (layer_norm.cpp, batch_norm.cpp) ------------------------------------------
// x: (..., C); weight, bias: (C) or undefined -> (..., C). Normalises over the last dim.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x: (N, C, H, W) or (N, C); running_mean/var: (C) updated in place when training (momentum as
// PyTorch: new = (1 - momentum) * old + momentum * batch, unbiased var for the running value).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);
// relu6(batch_norm(...)) as one op that saves what batch_norm saves (x and its statistics, plus
// bias) and no (N, C, H, W) tensor for the ReLU6: backward recomputes which outputs were clamped.
// Same output and gradients as the pair, bit for bit (MobileNetV2's BN + ReLU6).
Tensor batch_norm_relu6(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                        double eps = 1e-5);

// ---- convolution and pooling (conv2d.cpp, pool.cpp) ------------------------------------------
struct Conv2dParams {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
};
// x: (N, Cin, H, W), weight: (Cout, Cin/groups, KH, KW), bias: (Cout) or undefined
// -> (N, Cout, (H + 2p - KH)/s + 1, (W + 2p - KW)/s + 1)
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Conv2dParams p = {});
struct Pool2dParams {
  int64_t kernel = 2;
  int64_t stride = 0;  // 0 means = kernel
  int64_t padding = 0;
};
Tensor max_pool2d(const Tensor& x, Pool2dParams p);  // (N, C, H, W) -> (N, C, H', W')
Tensor avg_pool2d(const Tensor& x, Pool2dParams p);  // padding counts as zeros (count_include_pad)
Tensor global_avg_pool2d(const Tensor& x);           // (N, C, H, W) -> (N, C)

// ---- embedding, dropout, joining (embedding.cpp, dropout.cpp, join.cpp) ----------------------
// weight: (V, C), indices: (...) i64/i32 -> (..., C)
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Zeroes each element with probability p and scales the rest by 1/(1-p) (identity when !training
// or p == 0). The mask comes from `gen` (default generator if null) at a reserved stream offset.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);  // views

// ---- attention (attention.cpp, flash_attention.cpp) -------------------------------------------
// q, k, v: (B, NH, T, HS) -> (B, NH, T, HS); softmax(q k^T / sqrt(HS) + causal mask) v; dropout
// on the attention weights when dropout_p > 0. The tiled (flash) path on every device (cpu:N,
// cuda:N, meta): no (B, NH, T, T) tensor, saves the output and the row log-sum-exp; its output (and
// q, k, v's gradients) are (B, T, NH, HS)-laid-out views, so merging heads is free. On cuda:N the
// head size is at most 128.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                                    double dropout_p = 0.0, Generator* gen = nullptr);
// The materialised reference: (B, NH, T, T) weights computed whole and saved. Same values within
// float rounding and the same dropout draws as the default path.
Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                                         double dropout_p = 0.0, Generator* gen = nullptr);

}  // namespace mg
