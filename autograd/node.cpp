// Node bookkeeping and the helpers ops use to record history.
#include "autograd/node.h"

#include <atomic>

#include "autograd/grad_mode.h"

namespace mg {
namespace {
std::atomic<uint64_t> g_sequence{0};
}

Node::Node() : sequence_nr(g_sequence.fetch_add(1, std::memory_order_relaxed)) {}

void Node::release_saved() {
  for (SavedTensor* s : saved_) s->reset();
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge edge_of(const Tensor& t) {
  Edge e;
  if (!t.defined() || !t.requires_grad()) return e;
  if (t.grad_fn()) {
    e.fn = t.grad_fn();
    e.input_nr = t.output_nr();
  } else {
    e.leaf = t.impl_ptr();
  }
  return e;
}

void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs) {
  node->next_edges.clear();
  for (const Tensor& t : inputs) node->next_edges.push_back(edge_of(t));
  node->outputs.clear();
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    node->outputs.push_back({o.shape(), o.dtype(), o.device()});
    o.set_grad_fn(node, i);
  }
}

}  // namespace mg
