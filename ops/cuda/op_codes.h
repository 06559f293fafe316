// Which CUDA op code (launchers.h) runs each shared functor of ops/kernels/elementwise_functors.h,
// so an op file templated on a functor finds its CUDA kernel: CudaOpCode<fn::Exp>::code is
// UnaryOp::exp. Functors without a CUDA kernel have known == false. Plain C++.
#pragma once
#include "ops/cuda/launchers.h"
#include "ops/kernels/elementwise_functors.h"

namespace mg::cuda {

template <class F>
struct CudaOpCode {
  static constexpr bool known = false;
};

#define MG_CUDA_OP_CODE(F, value)              \
  template <>                                  \
  struct CudaOpCode<F> {                       \
    static constexpr bool known = true;        \
    static constexpr auto code = value;        \
  };

MG_CUDA_OP_CODE(fn::Neg, UnaryOp::neg)
MG_CUDA_OP_CODE(fn::Exp, UnaryOp::exp)
MG_CUDA_OP_CODE(fn::Log, UnaryOp::log)
MG_CUDA_OP_CODE(fn::Sqrt, UnaryOp::sqrt)
MG_CUDA_OP_CODE(fn::Rsqrt, UnaryOp::rsqrt)
MG_CUDA_OP_CODE(fn::Abs, UnaryOp::abs)
MG_CUDA_OP_CODE(fn::Tanh, UnaryOp::tanh)
MG_CUDA_OP_CODE(fn::Sigmoid, UnaryOp::sigmoid)
MG_CUDA_OP_CODE(fn::Relu, UnaryOp::relu)
MG_CUDA_OP_CODE(fn::Relu6, UnaryOp::relu6)
MG_CUDA_OP_CODE(fn::GeluTanh, UnaryOp::gelu_tanh)
MG_CUDA_OP_CODE(fn::Silu, UnaryOp::silu)

MG_CUDA_OP_CODE(fn::Add, BinaryOp::add)
MG_CUDA_OP_CODE(fn::Sub, BinaryOp::sub)
MG_CUDA_OP_CODE(fn::Mul, BinaryOp::mul)
MG_CUDA_OP_CODE(fn::Div, BinaryOp::div)
MG_CUDA_OP_CODE(fn::Pow, BinaryOp::pow)
MG_CUDA_OP_CODE(fn::Maximum, BinaryOp::maximum)
MG_CUDA_OP_CODE(fn::Minimum, BinaryOp::minimum)
MG_CUDA_OP_CODE(fn::ExpBackward, BinaryOp::exp_backward)
MG_CUDA_OP_CODE(fn::LogBackward, BinaryOp::log_backward)
MG_CUDA_OP_CODE(fn::SqrtBackward, BinaryOp::sqrt_backward)
MG_CUDA_OP_CODE(fn::RsqrtBackward, BinaryOp::rsqrt_backward)
MG_CUDA_OP_CODE(fn::AbsBackward, BinaryOp::abs_backward)
MG_CUDA_OP_CODE(fn::TanhBackward, BinaryOp::tanh_backward)
MG_CUDA_OP_CODE(fn::SigmoidBackward, BinaryOp::sigmoid_backward)
MG_CUDA_OP_CODE(fn::ReluBackward, BinaryOp::relu_backward)
MG_CUDA_OP_CODE(fn::Relu6Backward, BinaryOp::relu6_backward)
MG_CUDA_OP_CODE(fn::GeluTanhBackward, BinaryOp::gelu_tanh_backward)
MG_CUDA_OP_CODE(fn::SiluBackward, BinaryOp::silu_backward)

MG_CUDA_OP_CODE(fn::Eq, CompareOp::eq)
MG_CUDA_OP_CODE(fn::Ne, CompareOp::ne)
MG_CUDA_OP_CODE(fn::Lt, CompareOp::lt)
MG_CUDA_OP_CODE(fn::Le, CompareOp::le)
MG_CUDA_OP_CODE(fn::Gt, CompareOp::gt)
MG_CUDA_OP_CODE(fn::Ge, CompareOp::ge)

#undef MG_CUDA_OP_CODE

}  // namespace mg::cuda
