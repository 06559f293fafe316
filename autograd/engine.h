// The backward engine. It finds every node reachable from the roots, counts how many
// gradients each awaits, and runs a node once all have arrived, latest-created first. Right
// after a node runs, its saved tensors are released (unless retain_graph), so activation
// memory falls as backward proceeds. Leaf gradients accumulate across backward calls; a leaf's
// grad-ready hooks fire once its gradient for this pass is complete.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace mg {

struct BackwardOptions {
  bool retain_graph = false;
};

// root: a scalar (gradient 1) or any tensor with `grad` of its shape.
void backward(const Tensor& root, const Tensor& grad = Tensor(), BackwardOptions opt = {});
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              BackwardOptions opt = {});

}  // namespace mg
