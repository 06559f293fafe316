// Element-wise ops: unary math, broadcasting binary arithmetic and their scalar forms,
// comparisons, where and masked_fill. The math is the shared functors of
// ops/kernels/elementwise_functors.h; the CPU loops are cpu_loops.h, the CUDA kernels
// ops/cuda/elementwise_*.cu (the op code of each functor is in ops/cuda/op_codes.h).
//
// What each backward saves (only what it reads, and only if the gradient is needed):
// exp, sqrt, rsqrt, tanh, sigmoid, relu save their output; log, abs, relu6, gelu, silu their
// input; add/sub nothing; mul a if b needs grad and b if a does; div b (and a for db); pow both.
#include <cmath>

#include "ops/autocast_policy.h"
#include "ops/cpu_loops.h"
#include "ops/cuda/op_codes.h"
#include "ops/kernels/elementwise_functors.h"
#include "ops/ops.h"

namespace mg {

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  size_t off = shape.size() - size_t(t.dim());
  for (size_t i = 0; i < size_t(t.dim()); ++i) st[off + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

namespace {

enum class DTypeSet { floating, numeric };

// out = f(x), same shape and dtype as x.
template <class F>
Tensor map_unary(const char* op, const Tensor& x, F f, DTypeSet set = DTypeSet::floating) {
  check_defined(op, x, "input");
  OpNameGuard name(op);
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (x.device().is_cuda()) {
    if (set == DTypeSet::floating) check_floating(op, x);
    if constexpr (cuda::CudaOpCode<F>::known) cuda::unary(cuda::CudaOpCode<F>::code, out, x);
    else MG_THROW(op, ": internal: this functor has no CUDA kernel");
    return out;
  }
  if (set == DTypeSet::floating) {
    check_floating(op, x);
    MG_DISPATCH_FLOAT(x.dtype(), op, [&] { cpu_map1<scalar_t, scalar_t>(out, x, f); });
  } else {
    MG_DISPATCH_NUMERIC(x.dtype(), op, [&] { cpu_map1<scalar_t, scalar_t>(out, x, f); });
  }
  return out;
}

// out = f(a, b) broadcast, same dtype as a and b (or bool for comparisons).
template <class O, class F>
Tensor map_binary_as(const char* op, const Tensor& a, const Tensor& b, F f, DType out_dtype) {
  Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  Tensor out = empty(shape, {.dtype = out_dtype, .device = a.device()});
  if (a.device().is_cuda()) {
    cuda::compare(cuda::CudaOpCode<F>::code, out, a, b);
    return out;
  }
  MG_DISPATCH_NUMERIC(a.dtype(), op, [&] { cpu_map2<O, scalar_t, scalar_t>(out, a, b, f); });
  return out;
}

void check_binary(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "first input");
  check_defined(op, b, "second input");
  check_same_device(op, a, b);
  check_same_dtype(op, a, b);
}

template <class F>
Tensor map_binary(const char* op, const Tensor& a, const Tensor& b, F f, DTypeSet set) {
  check_binary(op, a, b);
  if (set == DTypeSet::floating) check_floating(op, a);
  OpNameGuard name(op);
  Tensor out;
  if (a.device().is_cuda()) {
    out = empty(broadcast_shapes(a.shape(), b.shape(), op), {.dtype = a.dtype(), .device = a.device()});
    if constexpr (cuda::CudaOpCode<F>::known) cuda::binary(cuda::CudaOpCode<F>::code, out, a, b);
    else MG_THROW(op, ": internal: this functor has no CUDA kernel");
    return out;
  }
  MG_DISPATCH_NUMERIC(a.dtype(), op, [&] {
    Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
    out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
    cpu_map2<scalar_t, scalar_t, scalar_t>(out, a, b, f);
  });
  return out;
}

// ---- unary with autograd ----

enum class SavedInput { input, output };

template <class Deriv>
class UnaryBackward : public Node {
 public:
  UnaryBackward(const char* name) : name_(name) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor s = saved.unpack();
    return {map_binary(name_, g[0], s, Deriv{}, DTypeSet::floating)};
  }
  SavedTensor saved{this};

 private:
  const char* name_;
};

template <class F, class Deriv>
Tensor unary_op(const char* op, const char* node_name, const Tensor& x, SavedInput which) {
  Tensor out = map_unary(op, x, F{});
  if (auto node = make_node_if_needed<UnaryBackward<Deriv>>({x}, node_name)) {
    node->saved.save(which == SavedInput::input ? x : out);
    set_history(node, {x}, {out});
  }
  return out;
}

class NegBackward : public Node {
 public:
  std::string_view name() const override { return "NegBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {neg(g[0])}; }
};

// ---- binary with autograd ----

class AddBackward : public Node {
 public:
  AddBackward(Shape a, Shape b, double sign) : a_(std::move(a)), b_(std::move(b)), sign_(sign) {}
  std::string_view name() const override { return sign_ > 0 ? "AddBackward" : "SubBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor da, db;
    if (needs_input_grad(0)) da = sum_to(g[0], a_);
    if (needs_input_grad(1)) db = sign_ > 0 ? sum_to(g[0], b_) : neg(sum_to(g[0], b_));
    return {da, db};
  }

 private:
  Shape a_, b_;
  double sign_;
};

class MulBackward : public Node {
 public:
  std::string_view name() const override { return "MulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor da, db;
    if (needs_input_grad(0)) da = sum_to(mul(g[0], b.unpack()), a_shape);
    if (needs_input_grad(1)) db = sum_to(mul(g[0], a.unpack()), b_shape);
    return {da, db};
  }
  SavedTensor a{this}, b{this};
  Shape a_shape, b_shape;
};

class DivBackward : public Node {
 public:
  std::string_view name() const override { return "DivBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor da, db;
    Tensor bv = b.unpack();
    if (needs_input_grad(0)) da = sum_to(div(g[0], bv), a_shape);
    if (needs_input_grad(1)) db = sum_to(neg(div(mul(g[0], a.unpack()), mul(bv, bv))), b_shape);
    return {da, db};
  }
  SavedTensor a{this}, b{this};
  Shape a_shape, b_shape;
};

class PowBackward : public Node {
 public:
  std::string_view name() const override { return "PowBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor av = a.unpack(), bv = b.unpack();
    Tensor da, db;
    if (needs_input_grad(0)) da = sum_to(mul(g[0], mul(bv, pow(av, sub(bv, 1.0)))), av.shape());
    if (needs_input_grad(1)) db = sum_to(mul(g[0], mul(out.unpack(), log(av))), bv.shape());
    return {da, db};
  }
  SavedTensor a{this}, b{this}, out{this};
};

// maximum/minimum: the gradient goes to the winner; ties split it evenly (as PyTorch).
class MaxMinBackward : public Node {
 public:
  explicit MaxMinBackward(bool is_max) : is_max_(is_max) {}
  std::string_view name() const override { return is_max_ ? "MaximumBackward" : "MinimumBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor av = a.unpack(), bv = b.unpack();
    Tensor wa = is_max_ ? gt(av, bv) : lt(av, bv);
    Tensor tie = eq(av, bv);
    Tensor share_a = add(cast(wa, g[0].dtype()), mul(cast(tie, g[0].dtype()), 0.5));
    Tensor da, db;
    if (needs_input_grad(0)) da = sum_to(mul(g[0], share_a), av.shape());
    if (needs_input_grad(1)) db = sum_to(mul(g[0], rsub(1.0, share_a)), bv.shape());
    return {da, db};
  }
  SavedTensor a{this}, b{this};

 private:
  bool is_max_;
};

// Scalar forms: out = f(x, s); the gradient is dout * k (k constant) for add/sub/mul/div.
class ScaleBackward : public Node {
 public:
  ScaleBackward(const char* name, double k) : name_(name), k_(k) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {k_ == 1.0 ? g[0] : mul(g[0], k_)}; }

 private:
  const char* name_;
  double k_;
};

class RdivBackward : public Node {  // d(a/x)/dx = -a/x^2 = -out/x
 public:
  std::string_view name() const override { return "RdivBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {neg(div(mul(g[0], out.unpack()), x.unpack()))};
  }
  SavedTensor x{this}, out{this};
};

class PowScalarBackward : public Node {
 public:
  explicit PowScalarBackward(double e) : e_(e) {}
  std::string_view name() const override { return "PowBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {mul(g[0], mul(pow(x.unpack(), e_ - 1.0), e_))};
  }
  SavedTensor x{this};

 private:
  double e_;
};

// `code` names the same function for the CUDA kernel (binary_scalar in ops/cuda/launchers.h).
template <class F>
Tensor scalar_op(const char* op, const Tensor& x, double s, F f, DTypeSet set, cuda::BinaryOp code) {
  check_defined(op, x, "input");
  if (set == DTypeSet::floating) check_floating(op, x);
  if (x.device().is_cuda()) {
    OpNameGuard name(op);
    Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
    cuda::binary_scalar(code, out, x, s);
    return out;
  }
  return map_unary(op, x, [f, s](auto v) { return f(v, decltype(v)(s)); }, DTypeSet::numeric);
}

Tensor scaled(const char* op, const char* node_name, const Tensor& x, Tensor out, double k) {
  if (auto node = make_node_if_needed<ScaleBackward>({x}, node_name, k)) set_history(node, {x}, {out});
  return out;
}

template <class F>
Tensor compare(const char* op, const Tensor& a, const Tensor& b, F f) {
  check_binary(op, a, b);
  OpNameGuard name(op);
  return map_binary_as<bool>(op, a, b, f, DType::b8);
}

template <class F>
Tensor compare_scalar(const char* op, const Tensor& a, double s, F f) {
  check_defined(op, a, "input");
  OpNameGuard name(op);
  Tensor out = empty(a.shape(), {.dtype = DType::b8, .device = a.device()});
  if (a.device().is_cuda()) {
    cuda::compare_scalar(cuda::CudaOpCode<F>::code, out, a, s);
    return out;
  }
  MG_DISPATCH_NUMERIC(a.dtype(), op, [&] {
    cpu_map1<bool, scalar_t>(out, a, [f, s](auto v) { return f(double(v), s); });
  });
  return out;
}

}  // namespace

// ---- unary -----------------------------------------------------------------------------------

Tensor neg(const Tensor& x) {
  Tensor out = map_unary("neg", x, fn::Neg{}, DTypeSet::numeric);
  if (auto node = make_node_if_needed<NegBackward>({x})) set_history(node, {x}, {out});
  return out;
}
Tensor exp(const Tensor& x) { return unary_op<fn::Exp, fn::ExpBackward>("exp", "ExpBackward", x, SavedInput::output); }
Tensor log(const Tensor& x) { return unary_op<fn::Log, fn::LogBackward>("log", "LogBackward", x, SavedInput::input); }
Tensor sqrt(const Tensor& x) { return unary_op<fn::Sqrt, fn::SqrtBackward>("sqrt", "SqrtBackward", x, SavedInput::output); }
Tensor rsqrt(const Tensor& x) {
  return unary_op<fn::Rsqrt, fn::RsqrtBackward>("rsqrt", "RsqrtBackward", x, SavedInput::output);
}
Tensor abs(const Tensor& x) { return unary_op<fn::Abs, fn::AbsBackward>("abs", "AbsBackward", x, SavedInput::input); }
Tensor tanh(const Tensor& x) { return unary_op<fn::Tanh, fn::TanhBackward>("tanh", "TanhBackward", x, SavedInput::output); }
Tensor sigmoid(const Tensor& x) {
  return unary_op<fn::Sigmoid, fn::SigmoidBackward>("sigmoid", "SigmoidBackward", x, SavedInput::output);
}
Tensor relu(const Tensor& x) { return unary_op<fn::Relu, fn::ReluBackward>("relu", "ReluBackward", x, SavedInput::output); }
Tensor relu6(const Tensor& x) {
  return unary_op<fn::Relu6, fn::Relu6Backward>("relu6", "Relu6Backward", x, SavedInput::input);
}
Tensor gelu_tanh(const Tensor& x) {
  return unary_op<fn::GeluTanh, fn::GeluTanhBackward>("gelu_tanh", "GeluTanhBackward", x, SavedInput::input);
}
Tensor gelu_tanh_backward(const Tensor& dout, const Tensor& x) {
  return map_binary("gelu_tanh_backward", dout, x, fn::GeluTanhBackward{}, DTypeSet::floating);
}
Tensor silu(const Tensor& x) { return unary_op<fn::Silu, fn::SiluBackward>("silu", "SiluBackward", x, SavedInput::input); }

// ---- binary ----------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return add(pa, pb);
  }
  Tensor out = map_binary("add", a, b, fn::Add{}, DTypeSet::numeric);
  if (auto node = make_node_if_needed<AddBackward>({a, b}, a.shape(), b.shape(), 1.0)) set_history(node, {a, b}, {out});
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return sub(pa, pb);
  }
  Tensor out = map_binary("sub", a, b, fn::Sub{}, DTypeSet::numeric);
  if (auto node = make_node_if_needed<AddBackward>({a, b}, a.shape(), b.shape(), -1.0)) set_history(node, {a, b}, {out});
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return mul(pa, pb);
  }
  Tensor out = map_binary("mul", a, b, fn::Mul{}, DTypeSet::numeric);
  if (auto node = make_node_if_needed<MulBackward>({a, b})) {
    if (b.requires_grad()) node->a.save(a);  // a is needed only for b's gradient
    if (a.requires_grad()) node->b.save(b);
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    set_history(node, {a, b}, {out});
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return div(pa, pb);
  }
  Tensor out = map_binary("div", a, b, fn::Div{}, DTypeSet::floating);
  if (auto node = make_node_if_needed<DivBackward>({a, b})) {
    if (b.requires_grad()) node->a.save(a);
    node->b.save(b);
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    set_history(node, {a, b}, {out});
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return pow(pa, pb);
  }
  Tensor out = map_binary("pow", a, b, fn::Pow{}, DTypeSet::floating);
  if (auto node = make_node_if_needed<PowBackward>({a, b})) {
    node->a.save(a);
    node->b.save(b);
    node->out.save(out);
    set_history(node, {a, b}, {out});
  }
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return maximum(pa, pb);
  }
  Tensor out = map_binary("maximum", a, b, fn::Maximum{}, DTypeSet::numeric);
  if (auto node = make_node_if_needed<MaxMinBackward>({a, b}, true)) {
    node->a.save(a);
    node->b.save(b);
    set_history(node, {a, b}, {out});
  }
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  if (needs_float_promotion(a, b)) {  // f32 + bf16 -> f32 (autocast branches meet f32 residuals)
    auto [pa, pb] = promote_floating(a, b);
    return minimum(pa, pb);
  }
  Tensor out = map_binary("minimum", a, b, fn::Minimum{}, DTypeSet::numeric);
  if (auto node = make_node_if_needed<MaxMinBackward>({a, b}, false)) {
    node->a.save(a);
    node->b.save(b);
    set_history(node, {a, b}, {out});
  }
  return out;
}

Tensor add(const Tensor& a, double b) {
  return scaled("add", "AddBackward", a, scalar_op("add", a, b, fn::Add{}, DTypeSet::numeric, cuda::BinaryOp::add), 1.0);
}
Tensor sub(const Tensor& a, double b) {
  return scaled("sub", "SubBackward", a, scalar_op("sub", a, b, fn::Sub{}, DTypeSet::numeric, cuda::BinaryOp::sub), 1.0);
}
Tensor mul(const Tensor& a, double b) {
  return scaled("mul", "MulBackward", a, scalar_op("mul", a, b, fn::Mul{}, DTypeSet::numeric, cuda::BinaryOp::mul), b);
}
Tensor div(const Tensor& a, double b) {
  return scaled("div", "DivBackward", a, scalar_op("div", a, b, fn::Div{}, DTypeSet::floating, cuda::BinaryOp::div), 1.0 / b);
}
Tensor rsub(double a, const Tensor& b) {
  Tensor out = scalar_op("rsub", b, a, [](auto x, auto s) { return s - x; }, DTypeSet::numeric, cuda::BinaryOp::rsub);
  return scaled("rsub", "RsubBackward", b, out, -1.0);
}
Tensor rdiv(double a, const Tensor& b) {
  Tensor out = scalar_op("rdiv", b, a, [](auto x, auto s) { return s / x; }, DTypeSet::floating, cuda::BinaryOp::rdiv);
  if (auto node = make_node_if_needed<RdivBackward>({b})) {
    node->x.save(b);
    node->out.save(out);
    set_history(node, {b}, {out});
  }
  return out;
}
Tensor pow(const Tensor& a, double e) {
  Tensor out = scalar_op("pow", a, e, [](auto x, auto s) { return decltype(x)(std::pow(x, s)); }, DTypeSet::floating,
                         cuda::BinaryOp::pow);
  if (auto node = make_node_if_needed<PowScalarBackward>({a}, e)) {
    node->x.save(a);
    set_history(node, {a}, {out});
  }
  return out;
}

// ---- comparisons, where, masked_fill -----------------------------------------------------------

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", a, b, fn::Eq{}); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", a, b, fn::Ne{}); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", a, b, fn::Lt{}); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", a, b, fn::Le{}); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", a, b, fn::Gt{}); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", a, b, fn::Ge{}); }
Tensor eq(const Tensor& a, double b) { return compare_scalar("eq", a, b, fn::Eq{}); }
Tensor lt(const Tensor& a, double b) { return compare_scalar("lt", a, b, fn::Lt{}); }
Tensor gt(const Tensor& a, double b) { return compare_scalar("gt", a, b, fn::Gt{}); }

namespace {
class WhereBackward : public Node {
 public:
  std::string_view name() const override { return "WhereBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor c = cond.unpack();
    Tensor zero = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
    Tensor da, db;
    if (needs_input_grad(1)) da = sum_to(where(c, g[0], zero), a_shape);
    if (needs_input_grad(2)) db = sum_to(where(c, zero, g[0]), b_shape);
    return {Tensor(), da, db};
  }
  SavedTensor cond{this};
  Shape a_shape, b_shape;
};
}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const char* op = "where";
  check_defined(op, cond, "condition");
  check_binary(op, a, b);
  check_same_device(op, cond, a);
  MG_CHECK(cond.dtype() == DType::b8, "where: the condition must be bool, got ", cond.dtype());
  OpNameGuard name(op);
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), op), b.shape(), op);
  Tensor out = empty(shape, {.dtype = a.dtype(), .device = a.device()});
  if (a.device().is_cuda()) cuda::where(out, cond, a, b);
  else
    MG_DISPATCH_ALL(a.dtype(), op, [&] {
      cpu_map3<scalar_t, bool, scalar_t, scalar_t>(out, cond, a, b, [](bool c, auto x, auto y) { return c ? x : y; });
    });
  if (auto node = make_node_if_needed<WhereBackward>({a, b})) {
    node->cond.save(cond);
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    set_history(node, {cond, a, b}, {out});
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", x, "input");
  Tensor v = full({}, value, {.dtype = x.dtype(), .device = x.device()});
  Tensor out = where(mask, v, x);
  MG_CHECK(out.shape() == x.shape(), "masked_fill: mask ", shape_str(mask.shape()), " does not broadcast to input ",
           shape_str(x.shape()));
  return out;
}

}  // namespace mg
