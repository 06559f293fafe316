// CUDA unary element-wise ops and the tensor-scalar forms (x + s, s - x, x ** s, ...): each op
// code maps to its shared functor and runs through launch_map1 (elementwise.cuh).
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

// x ** s computed in f64, as the CPU's scalar pow.
struct PowScalar {
  template <class T>
  __device__ __forceinline__ T operator()(T x, double s) const { return T(::pow(double(x), s)); }
};

template <class F>
void run_float(const char* op, const Tensor& out, const Tensor& x, F f) {
  MG_DISPATCH_FLOAT(x.dtype(), op, [&] { launch_map1<scalar_t, scalar_t>(op, out, x, f); });
}

template <class F>
void run_numeric_scalar(const char* op, const Tensor& out, const Tensor& x, double s, F f) {
  MG_DISPATCH_NUMERIC(x.dtype(), op, [&] {
    using C = compute_t<scalar_t>;
    launch_map1<scalar_t, scalar_t>(op, out, x, BindScalar<F, C>{f, static_cast<C>(s)});
  });
}

template <class F>
void run_float_scalar(const char* op, const Tensor& out, const Tensor& x, double s, F f) {
  MG_DISPATCH_FLOAT(x.dtype(), op, [&] {
    using C = compute_t<scalar_t>;
    launch_map1<scalar_t, scalar_t>(op, out, x, BindScalar<F, C>{f, static_cast<C>(s)});
  });
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& x) {
  switch (op) {
    case UnaryOp::neg:
      return MG_DISPATCH_NUMERIC(x.dtype(), "neg", [&] { launch_map1<scalar_t, scalar_t>("neg", out, x, fn::Neg{}); });
    case UnaryOp::exp: return run_float("exp", out, x, fn::Exp{});
    case UnaryOp::log: return run_float("log", out, x, fn::Log{});
    case UnaryOp::sqrt: return run_float("sqrt", out, x, fn::Sqrt{});
    case UnaryOp::rsqrt: return run_float("rsqrt", out, x, fn::Rsqrt{});
    case UnaryOp::abs: return run_float("abs", out, x, fn::Abs{});
    case UnaryOp::tanh: return run_float("tanh", out, x, fn::Tanh{});
    case UnaryOp::sigmoid: return run_float("sigmoid", out, x, fn::Sigmoid{});
    case UnaryOp::relu: return run_float("relu", out, x, fn::Relu{});
    case UnaryOp::relu6: return run_float("relu6", out, x, fn::Relu6{});
    case UnaryOp::gelu_tanh: return run_float("gelu_tanh", out, x, fn::GeluTanh{});
    case UnaryOp::silu: return run_float("silu", out, x, fn::Silu{});
  }
  MG_THROW("cuda::unary: unknown op code ", int(op));
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s) {
  switch (op) {
    case BinaryOp::add: return run_numeric_scalar("add", out, a, s, fn::Add{});
    case BinaryOp::sub: return run_numeric_scalar("sub", out, a, s, fn::Sub{});
    case BinaryOp::mul: return run_numeric_scalar("mul", out, a, s, fn::Mul{});
    case BinaryOp::rsub: return run_numeric_scalar("rsub", out, a, s, RSub{});
    case BinaryOp::div: return run_float_scalar("div", out, a, s, fn::Div{});
    case BinaryOp::rdiv: return run_float_scalar("rdiv", out, a, s, RDiv{});
    case BinaryOp::pow:
      return MG_DISPATCH_FLOAT(a.dtype(), "pow", [&] {
        launch_map1<scalar_t, scalar_t>("pow", out, a, BindScalar<PowScalar, double>{PowScalar{}, s});
      });
    default: break;
  }
  MG_THROW("cuda::binary_scalar: op code ", int(op), " has no scalar form");
}

}  // namespace mg::cuda
