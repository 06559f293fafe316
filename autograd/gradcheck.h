// gradcheck: compares the gradients autograd computes with central finite differences, in f64.
// For a random projection r of the output, it checks d(sum(r * f(x)))/dx from backward against
// (s(x + eps) - s(x - eps)) / 2eps for every element of every input that requires grad.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mg {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 1234;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytical vs numerical
};

// fn maps the inputs to one output tensor. Inputs must be f64; those with requires_grad are checked.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions opt = {});

}  // namespace mg
