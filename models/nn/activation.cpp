// Parameter-free layers: activations and dropout, thin wrappers over ops/ that give the
// profiler a module path and let Sequential chain them.
#include "models/nn/layers.h"

namespace mg {

Dropout::Dropout(double p_, Generator* gen) : UnaryModule("Dropout"), p(p_), gen_(gen) {
  MG_CHECK(p_ >= 0.0 && p_ < 1.0, "Dropout: p must be in [0, 1), got ", p_);
}

Tensor Dropout::forward(const Tensor& x) {
  auto scope = forward_scope();
  return dropout(x, p, is_training(), gen_);
}

Tensor ReLU::forward(const Tensor& x) {
  auto scope = forward_scope();
  return relu(x);
}

Tensor ReLU6::forward(const Tensor& x) {
  auto scope = forward_scope();
  return relu6(x);
}

Tensor GELU::forward(const Tensor& x) {
  auto scope = forward_scope();
  return gelu_tanh(x);
}

Tensor SiLU::forward(const Tensor& x) {
  auto scope = forward_scope();
  return silu(x);
}

}  // namespace mg
