// Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"):
// checkpoint(fn, inputs) runs fn without recording a graph, so none of its intermediate
// activations are saved; only its inputs are. When backward reaches the segment, fn runs again
// with the graph on (the same dropout masks, the same autocast state, the same module path) and
// a nested backward through that fresh graph yields the inputs' gradients and accumulates the
// parameters'. Memory: the segment's activations exist once at a time, during its own backward;
// time: one extra forward of the segment. The recomputation is bit-identical to the original
// forward (every kernel is deterministic), so gradients equal those without checkpointing.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg {

using SegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// outputs = fn(inputs), recomputed in backward instead of saved. Without grad mode (evaluation)
// it is just fn(inputs). fn must be a pure function of its inputs, the parameters it reads and
// the random streams it draws from (positions are replayed); it may return views of its inputs.
std::vector<Tensor> checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs);
// The common one-tensor case: y = fn(x).
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

// True while a checkpointed segment is being recomputed in backward. Layers with side effects in
// forward skip them then (BatchNorm does not update its running statistics a second time).
bool checkpoint_recomputing();

// Which parts of a model are checkpointed (the apps' `--checkpoint` option).
//   none         nothing (every activation is saved)
//   blocks       every block is its own segment
//   every:K      blocks 0, K, 2K, ... are checkpointed (each on its own); the others save as usual
//   sqrt         ceil(sqrt(n)) consecutive blocks per segment (Chen et al.: O(sqrt n) memory)
//   selective    inside each block only the cheap, large part is recomputed: the attention core
//                (scores, softmax, dropout) of a GPT block (Korthikanti et al. 2022), the batch
//                norm + ReLU6 pairs of a MobileNetV2 block
struct CheckpointPolicy {
  enum class Kind { none, blocks, every, sqrt, selective };
  Kind kind = Kind::none;
  int64_t every = 1;  // K of every:K

  // "none", "blocks", "every:K" (K >= 1), "sqrt", "selective"; anything else is an error naming it.
  static CheckpointPolicy parse(const std::string& text);
  std::string str() const;
  bool enabled() const { return kind != Kind::none; }
  // Whole-block segments [begin, end) over n blocks (none and selective: no segments).
  std::vector<std::pair<int64_t, int64_t>> segments(int64_t n_blocks) const;
};

// One block of a chain: y = block(x) (a layer's forward, usually a lambda over a module).
using BlockFn = std::function<Tensor(const Tensor&)>;

// x through blocks[0], blocks[1], ... in order, under `policy`: each of policy.segments(n) runs as
// one checkpoint() segment (only its input is saved; backward recomputes it), the blocks outside
// every segment save their activations as usual. none and selective run the blocks plainly
// (selective checkpointing lives inside a model's blocks). Gradients are bit-identical to the
// plain chain's. The segments keep their own copies of the block functions for the recompute,
// so `blocks` may be a temporary; what the functions capture must outlive backward.
Tensor checkpoint_sequential(const std::vector<BlockFn>& blocks, const CheckpointPolicy& policy, const Tensor& x);

}  // namespace mg
