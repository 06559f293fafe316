// The bias gradient of a linear layer: dbias (out) = column sums of dout (R, out), shared by
// LinearBackward (ops/matmul.cpp) and GeluLinearBackward (ops/gelu_linear.cpp). Each column is
// added over rows 0 .. R-1 in order, as sum(dout, {0}) does, so the bits are sum's; f32 on the CPU
// splits the columns into blocks of 64 over the threads (sum's blocks of 256 left one thread idle
// on a 256-wide bias); anything else is sum(dout, {0}).
#pragma once
#include "core/tensor.h"

namespace mg {

Tensor bias_grad(const Tensor& dout2);  // (R, out) -> (out)

}  // namespace mg
