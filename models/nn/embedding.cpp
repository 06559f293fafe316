// Embedding: a (V, C) table looked up by integer indices, initialised N(0, std^2).
#include "models/nn/init.h"
#include "models/nn/layers.h"

namespace mg {

Embedding::Embedding(int64_t v, int64_t c, double std, const InitOptions& init)
    : UnaryModule("Embedding"), num_embeddings(v), embedding_dim(c) {
  MG_CHECK(v > 0 && c > 0, "Embedding: sizes must be positive, got ", v, " x ", c);
  MG_CHECK(std >= 0, "Embedding: std must be non-negative, got ", std);
  Tensor w = parameter_empty({v, c}, init.dtype, init.device);
  normal_(w, 0.0, std, init.generator());
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  auto scope = forward_scope();
  return embedding(weight, indices);
}

}  // namespace mg
