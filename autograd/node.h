// Node: one backward function of the graph. An op that records history creates a Node
// subclass holding what its backward needs (as SavedTensor members), points its next_edges at
// the nodes (or leaf tensors) that produced its inputs, and becomes the grad_fn of its outputs.
// The engine (engine.h) calls apply() with the gradients of the outputs and routes what it
// returns, one gradient per input, along next_edges.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "autograd/saved_tensor.h"
#include "core/tensor.h"

namespace mg {

// Where the gradient of one input goes: another node's output slot, or a leaf's .grad.
struct Edge {
  std::shared_ptr<Node> fn;          // set when the input was computed by an op
  uint32_t input_nr = 0;             // which of fn's outputs the input was
  std::shared_ptr<TensorImpl> leaf;  // set when the input is a leaf that requires grad
  bool valid() const { return fn || leaf; }
};

// What the engine needs to know of each output (to check gradient shapes).
struct OutputInfo {
  Shape shape;
  DType dtype;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // "MulBackward": used in error messages, printing and the profiler.
  virtual std::string_view name() const = 0;
  // grad_outputs[i] is the gradient of output i (undefined when no gradient flows into it).
  // Returns one gradient per next edge (undefined for inputs that need none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;

  // Drops every SavedTensor of this node (the engine calls it right after apply()).
  void release_saved();

  std::vector<Edge> next_edges;
  std::vector<OutputInfo> outputs;
  uint64_t sequence_nr;  // creation order; the engine runs later nodes first

  // Whether input i's gradient is needed (so apply can skip work).
  bool needs_input_grad(size_t i) const { return i < next_edges.size() && next_edges[i].valid(); }

 private:
  friend class SavedTensor;
  std::vector<SavedTensor*> saved_;
};

// Does any input need a gradient, with grad mode on? (An op only records history if so.)
bool any_requires_grad(const std::vector<Tensor>& inputs);
// The edge for one input (invalid edge when it needs no gradient).
Edge edge_of(const Tensor& t);
// Wires `node` into the graph: next edges from inputs, outputs' grad_fn to node.
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs);

}  // namespace mg
