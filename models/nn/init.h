// Parameter initialisation from an explicit Generator, so a model built from one seed is the
// same on every run and thread count. Each call reserves numel consecutive positions of the
// generator's stream (Generator::advance) and element i takes the value at position first + i;
// on meta the positions are reserved but nothing is written.
#pragma once
#include <cmath>

#include "core/rng.h"
#include "core/tensor.h"

namespace mg {

// t: any floating tensor (written in row-major order, any strides). Bumps t's version.
void uniform_(const Tensor& t, double lo, double hi, Generator& gen);
void normal_(const Tensor& t, double mean, double std, Generator& gen);

// PyTorch's default for Linear and Conv2d weights and biases (kaiming_uniform_ with a = sqrt(5)
// reduces to this): U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
inline double fan_in_bound(int64_t fan_in) { return fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0; }

}  // namespace mg
