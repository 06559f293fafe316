// Activation checkpointing (see checkpoint.h). Forward runs the segment under no_grad and wires
// one CheckpointBackward node between the segment's inputs and outputs; that node saves only the
// inputs (as SavedTensors, so offload hooks and the engine's early release apply to them). Its
// backward re-runs the segment with the forward's context restored, then runs a nested backward
// through the recomputed graph.
#include "autograd/checkpoint.h"

#include <cmath>
#include <memory>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "core/rng.h"

namespace mg {

namespace {

thread_local int t_recomputing = 0;

// Rewinds the recorded streams for the recomputation and puts them back afterwards, so the
// draws of the rest of training are unaffected by when (or whether) backward recomputes.
class StreamRewind {
 public:
  explicit StreamRewind(const std::vector<std::pair<Generator*, uint64_t>>& starts) {
    for (const auto& [gen, offset] : starts) {
      now_.emplace_back(gen, gen->offset());
      gen->set_offset(offset);
    }
  }
  ~StreamRewind() {
    for (const auto& [gen, offset] : now_) gen->set_offset(offset);
  }
  StreamRewind(const StreamRewind&) = delete;
  StreamRewind& operator=(const StreamRewind&) = delete;

 private:
  std::vector<std::pair<Generator*, uint64_t>> now_;
};

class RecomputeScope {
 public:
  RecomputeScope() { ++t_recomputing; }
  ~RecomputeScope() { --t_recomputing; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// Restores the autocast state of the forward for the recomputation.
class AutocastRestore {
 public:
  explicit AutocastRestore(AutocastState s) : prev_(autocast_state()) { set_autocast_state(s); }
  ~AutocastRestore() { set_autocast_state(prev_); }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  AutocastState prev_;
};

class CheckpointBackward : public Node {
 public:
  std::string_view name() const override { return "CheckpointBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    // Fresh leaves standing for the inputs: the nested backward stops at them and leaves the
    // inputs' gradients in their .grad.
    std::vector<Tensor> leaves(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i]->defined()) continue;
      leaves[i] = inputs[i]->unpack().detach();
      if (needs_input_grad(i)) leaves[i].set_requires_grad(true);
    }
    std::vector<Tensor> outs;
    {
      RecomputeScope recomputing;
      EnableGradGuard grad_on;
      AutocastRestore amp(autocast);
      ModulePathRestoreGuard path(module_path);
      MemoryCategoryGuard category(MemoryCategory::activation);
      OpNameGuard op("");
      StreamRewind rewind(streams);
      outs = fn(leaves);
    }
    MG_CHECK(outs.size() == grad_outputs.size(), "checkpoint: the recomputed segment returned ", outs.size(),
             " outputs, the forward returned ", grad_outputs.size(), " (the segment is not a pure function)");
    std::vector<Tensor> roots, grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!grad_outputs[i].defined() || !outs[i].defined() || !outs[i].requires_grad()) continue;
      MG_CHECK(outs[i].shape() == grad_outputs[i].shape(), "checkpoint: recomputed output ", i, " has shape ",
               shape_str(outs[i].shape()), ", the forward's had ", shape_str(grad_outputs[i].shape()));
      roots.push_back(outs[i]);
      grads.push_back(grad_outputs[i]);
    }
    outs.clear();
    if (!roots.empty()) backward(roots, grads);
    std::vector<Tensor> dinputs(inputs.size());
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i].defined() && needs_input_grad(i)) dinputs[i] = leaves[i].grad();
    return dinputs;
  }

  SegmentFn fn;
  std::vector<std::unique_ptr<SavedTensor>> inputs;
  std::vector<std::pair<Generator*, uint64_t>> streams;
  AutocastState autocast;
  std::string module_path;
};

}  // namespace

bool checkpoint_recomputing() { return t_recomputing > 0; }

std::vector<Tensor> checkpoint(const SegmentFn& fn, const std::vector<Tensor>& inputs) {
  MG_CHECK(fn, "checkpoint: the segment function is empty");
  if (!grad_enabled()) return fn(inputs);
  auto node = std::make_shared<CheckpointBackward>();
  std::vector<Tensor> outputs;
  {
    StreamRecorder recorder;
    NoGradGuard no_grad;
    outputs = fn(inputs);
    node->streams = recorder.starts();
  }
  node->fn = fn;
  node->autocast = autocast_state();
  node->module_path = current_module_path();
  for (const Tensor& x : inputs) {
    node->inputs.push_back(std::make_unique<SavedTensor>(node.get()));
    if (x.defined()) node->inputs.back()->save(x);
  }
  // Outputs become the node's: an output that is an input itself (or aliases its impl) gets a
  // new handle first, so the input keeps its own history.
  for (Tensor& y : outputs) {
    MG_CHECK(y.defined(), "checkpoint: the segment returned an undefined tensor");
    for (const Tensor& x : inputs)
      if (x.is_same(y)) y = y.detach();
  }
  set_history(node, inputs, outputs);
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  MG_CHECK(fn, "checkpoint: the segment function is empty");
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{x})[0];
}

// ---- policies ---------------------------------------------------------------------------------

CheckpointPolicy CheckpointPolicy::parse(const std::string& text) {
  CheckpointPolicy p;
  if (text == "none" || text.empty()) return p;
  if (text == "blocks") {
    p.kind = Kind::blocks;
  } else if (text == "sqrt") {
    p.kind = Kind::sqrt;
  } else if (text == "selective") {
    p.kind = Kind::selective;
  } else if (text.rfind("every:", 0) == 0) {
    const std::string k = text.substr(6);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(k, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MG_CHECK(used == k.size() && !k.empty() && v >= 1, "checkpoint policy '", text,
             "': 'every:K' needs a whole K >= 1");
    p.kind = Kind::every;
    p.every = v;
  } else {
    MG_THROW("checkpoint policy '", text, "' is unknown; expected none, blocks, every:K, sqrt or selective");
  }
  return p;
}

std::string CheckpointPolicy::str() const {
  switch (kind) {
    case Kind::none: return "none";
    case Kind::blocks: return "blocks";
    case Kind::every: return "every:" + std::to_string(every);
    case Kind::sqrt: return "sqrt";
    case Kind::selective: return "selective";
  }
  return "?";
}

Tensor checkpoint_sequential(const std::vector<BlockFn>& blocks, const CheckpointPolicy& policy, const Tensor& x) {
  const int64_t n = int64_t(blocks.size());
  Tensor y = x;
  int64_t i = 0;
  for (const auto& [begin, end] : policy.segments(n)) {
    for (; i < begin; ++i) y = blocks[size_t(i)](y);
    std::vector<BlockFn> segment(blocks.begin() + begin, blocks.begin() + end);  // outlives this call
    y = checkpoint(
        [segment = std::move(segment)](const Tensor& in) {
          Tensor t = in;
          for (const BlockFn& block : segment) t = block(t);
          return t;
        },
        y);
    i = end;
  }
  for (; i < n; ++i) y = blocks[size_t(i)](y);
  return y;
}

std::vector<std::pair<int64_t, int64_t>> CheckpointPolicy::segments(int64_t n) const {
  std::vector<std::pair<int64_t, int64_t>> s;
  switch (kind) {
    case Kind::none:
    case Kind::selective: break;
    case Kind::blocks:
      for (int64_t i = 0; i < n; ++i) s.emplace_back(i, i + 1);
      break;
    case Kind::every:
      for (int64_t i = 0; i < n; i += every) s.emplace_back(i, i + 1);
      break;
    case Kind::sqrt: {
      const int64_t len = std::max<int64_t>(1, int64_t(std::ceil(std::sqrt(double(n)))));
      for (int64_t i = 0; i < n; i += len) s.emplace_back(i, std::min(n, i + len));
      break;
    }
  }
  return s;
}

}  // namespace mg
