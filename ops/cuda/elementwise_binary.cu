// CUDA binary element-wise ops with broadcasting: forward arithmetic and the backward functors
// (dx = f(dout, saved)), each op code mapped to its shared functor, run by launch_map2.
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

template <class F>
void run_numeric(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  MG_DISPATCH_NUMERIC(a.dtype(), op, [&] { launch_map2<scalar_t, scalar_t>(op, out, a, b, f); });
}

template <class F>
void run_float(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  MG_DISPATCH_FLOAT(a.dtype(), op, [&] { launch_map2<scalar_t, scalar_t>(op, out, a, b, f); });
}

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::add: return run_numeric("add", out, a, b, fn::Add{});
    case BinaryOp::sub: return run_numeric("sub", out, a, b, fn::Sub{});
    case BinaryOp::mul: return run_numeric("mul", out, a, b, fn::Mul{});
    case BinaryOp::maximum: return run_numeric("maximum", out, a, b, fn::Maximum{});
    case BinaryOp::minimum: return run_numeric("minimum", out, a, b, fn::Minimum{});
    case BinaryOp::div: return run_float("div", out, a, b, fn::Div{});
    case BinaryOp::pow: return run_float("pow", out, a, b, fn::Pow{});
    case BinaryOp::exp_backward: return run_float("ExpBackward", out, a, b, fn::ExpBackward{});
    case BinaryOp::log_backward: return run_float("LogBackward", out, a, b, fn::LogBackward{});
    case BinaryOp::sqrt_backward: return run_float("SqrtBackward", out, a, b, fn::SqrtBackward{});
    case BinaryOp::rsqrt_backward: return run_float("RsqrtBackward", out, a, b, fn::RsqrtBackward{});
    case BinaryOp::abs_backward: return run_float("AbsBackward", out, a, b, fn::AbsBackward{});
    case BinaryOp::tanh_backward: return run_float("TanhBackward", out, a, b, fn::TanhBackward{});
    case BinaryOp::sigmoid_backward: return run_float("SigmoidBackward", out, a, b, fn::SigmoidBackward{});
    case BinaryOp::relu_backward: return run_float("ReluBackward", out, a, b, fn::ReluBackward{});
    case BinaryOp::relu6_backward: return run_float("Relu6Backward", out, a, b, fn::Relu6Backward{});
    case BinaryOp::gelu_tanh_backward: return run_float("GeluTanhBackward", out, a, b, fn::GeluTanhBackward{});
    case BinaryOp::silu_backward: return run_float("SiluBackward", out, a, b, fn::SiluBackward{});
    case BinaryOp::rsub:
    case BinaryOp::rdiv: break;
  }
  MG_THROW("cuda::binary: op code ", int(op), " has no tensor-tensor form");
}

}  // namespace mg::cuda
