// The backward engine (see engine.h).
#include "autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/memory_category.h"

namespace mg {
namespace {

// Adds g into slot (which may be undefined). Gradients produced by ops are fresh tensors, so
// the first one is taken as is; later ones are summed into a new tensor owned by the slot.
void add_into(Tensor& slot, const Tensor& g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = g;
    return;
  }
  if (slot.storage().use_count() > 1 || !slot.is_contiguous()) {
    Tensor fresh = empty(slot.shape(), {.dtype = slot.dtype(), .device = slot.device()});
    copy_(fresh, slot);
    slot = fresh;
  }
  accumulate_(slot, g);
}

void accumulate_leaf(TensorImpl* leaf_impl, const std::shared_ptr<TensorImpl>& keep, const Tensor& g) {
  Tensor leaf(keep);
  MG_INTERNAL_ASSERT(g.shape() == leaf.shape(), "gradient shape ", shape_str(g.shape()), " for leaf ",
                     shape_str(leaf.shape()));
  MG_CHECK(g.dtype() == leaf.dtype(), "backward: gradient dtype ", g.dtype(), " differs from the leaf's ",
           leaf.dtype());
  Tensor cur = leaf.grad();
  if (!cur.defined()) {
    // A gradient that shares storage with something else (a view, an input) must not become
    // the leaf's .grad: later accumulation would write through it.
    if (g.storage().use_count() > 1 || !g.is_contiguous()) {
      Tensor fresh = empty(g.shape(), {.dtype = g.dtype(), .device = g.device()});
      copy_(fresh, g);
      leaf.set_grad(fresh);
    } else {
      leaf.set_grad(g);
    }
  } else {
    accumulate_(cur, g);
  }
  (void)leaf_impl;
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad, BackwardOptions opt) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad}, opt);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads_in, BackwardOptions opt) {
  MG_CHECK(grads_in.empty() || grads_in.size() == roots.size(), "backward: ", roots.size(), " roots but ",
           grads_in.size(), " gradients");
  NoGradGuard no_grad;  // backward functions do not record graphs
  AutocastGuard no_autocast(DType::bf16, false);  // backward sees forward's dtypes (Note [Autocast])
  MemoryCategoryGuard tag(MemoryCategory::gradient);
  OpNameGuard op("backward");

  // Root gradients.
  std::vector<Tensor> root_grads(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    MG_CHECK(r.requires_grad(), "backward: tensor ", i, " does not require grad and has no grad_fn "
             "(was it computed under no_grad, or from tensors without requires_grad?)");
    Tensor g = i < grads_in.size() ? grads_in[i] : Tensor();
    if (!g.defined()) {
      MG_CHECK(r.numel() == 1, "backward: the gradient can be implicit only for a one-element output; "
               "this output has shape ", shape_str(r.shape()), ", pass a gradient of that shape");
      g = ones(r.shape(), {.dtype = r.dtype(), .device = r.device()});
    }
    MG_CHECK(g.shape() == r.shape(), "backward: gradient shape ", shape_str(g.shape()), " does not match output shape ",
             shape_str(r.shape()));
    root_grads[i] = g;
  }

  // Count, for every node reachable from the roots, how many gradients it will receive; and for
  // every leaf how many contributions it will get (to fire its grad-ready hooks when complete).
  std::unordered_map<Node*, int> deps;
  std::unordered_map<TensorImpl*, int> leaf_pending;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Tensor& r : roots)
    if (r.grad_fn() && seen.insert(r.grad_fn().get()).second) stack.push_back(r.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (e.fn) {
        ++deps[e.fn.get()];
        if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
      } else if (e.leaf) {
        ++leaf_pending[e.leaf.get()];
      }
    }
  }

  struct Later {
    bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
      return a->sequence_nr < b->sequence_nr;
    }
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, Later> ready;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;

  auto deliver_leaf = [&](const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    if (g.defined()) accumulate_leaf(leaf.get(), leaf, g);
    if (--leaf_pending[leaf.get()] == 0) {
      Tensor lt(leaf);
      if (lt.grad().defined())
        for (const auto& hook : lt.grad_ready_hooks()) hook(lt.grad());
    }
  };

  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    if (!r.grad_fn()) {  // a leaf root: its gradient is the given one
      ++leaf_pending[r.impl()];
      deliver_leaf(r.impl_ptr(), root_grads[i]);
      continue;
    }
    auto& buf = buffers[r.grad_fn().get()];
    buf.resize(r.grad_fn()->outputs.size());
    add_into(buf[r.output_nr()], root_grads[i]);
  }
  for (const Tensor& r : roots)
    if (r.grad_fn() && deps[r.grad_fn().get()] == 0 && buffers.count(r.grad_fn().get())) {
      ready.push(r.grad_fn());
      deps[r.grad_fn().get()] = -1;  // queued
    }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> gin = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    gin.resize(node->outputs.size());
    std::vector<Tensor> gout;
    bool any_grad = false;
    for (const Tensor& g : gin) any_grad = any_grad || g.defined();
    if (!any_grad) {
      gout.resize(node->next_edges.size());  // nothing flows: every input gets no gradient
    } else {
      OpNameGuard node_op(node->name().data());
      gout = node->apply(std::move(gin));
    }
    if (!opt.retain_graph) node->release_saved();
    MG_INTERNAL_ASSERT(gout.size() == node->next_edges.size(), node->name(), " returned ", gout.size(),
                       " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < gout.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (e.leaf) {
        deliver_leaf(e.leaf, gout[i]);
      } else if (e.fn) {
        Node* next = e.fn.get();
        auto& buf = buffers[next];
        buf.resize(next->outputs.size());
        if (gout[i].defined()) {
          const OutputInfo& info = next->outputs[e.input_nr];
          MG_INTERNAL_ASSERT(gout[i].shape() == info.shape, node->name(), " produced a gradient of shape ",
                             shape_str(gout[i].shape()), " for an input of shape ", shape_str(info.shape));
          add_into(buf[e.input_nr], gout[i]);
        }
        if (--deps[next] == 0) ready.push(e.fn);
      }
    }
  }
}

}  // namespace mg
