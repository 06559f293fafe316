// Synthetic datasets for demos and tests: two interleaved 2-D spirals, drawn from a seeded
// Generator so every run sees the same points. Small enough to train on in a second, hard enough
// that a linear model fails (a good first check that autograd, layers and optimizers work).
#pragma once
#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"

namespace mg {

struct LabeledPoints {
  Tensor x;  // (N, 2) f32
  Tensor y;  // (N) i64 class index in {0, 1}
};

// Class k at angle 4 pi t + k pi, radius 0.1 + 0.9 t, t ~ U(0, 1), plus N(0, noise^2) per coordinate.
// Draws 3 N positions from `gen` (so consecutive calls give independent sets).
LabeledPoints two_spirals(int64_t n_per_class, Generator& gen, double noise = 0.02, Device device = kCPU);

}  // namespace mg
