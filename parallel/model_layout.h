// ModelLayout: how a model lines up for model parallelism. It names the modules that can be
// placed on a device of their own (their owner calls them through UnaryModule::operator(), which
// moves the input to their device; see Note [Residual stream across devices] in models/gpt.cpp),
// the repeated blocks that `stages:K` / `balanced` cut into contiguous groups, and the modules
// that travel with the first and the last group. Known models: GPT and MobileNetV2.
#pragma once
#include <string>
#include <vector>

#include "models/nn/module.h"

namespace mg {

struct ModelLayout {
  std::string model;                 // "GPT", "MobileNetV2"
  // The finest placeable modules, in forward order; every parameter lies in exactly one.
  std::vector<std::string> leaves;
  // The repeated blocks in forward order (GPT: h.N; MobileNetV2: the inverted residual blocks
  // features.1 ... features.17); each is placeable as a whole.
  std::vector<std::string> blocks;
  std::vector<std::string> first;    // with the first group: wte, wpe (the tied head) / the stem
  std::vector<std::string> last;     // with the last group: ln_f / the last 1x1 conv, classifier
  // Placeable containers of leaves other than blocks ("h", "features").
  std::vector<std::string> groups;
  std::string input;   // the leaf that reads the batch: wte / features.0
  std::string output;  // the leaf whose device gets the logits and the loss: wte (tied head) / classifier
  std::string hint;                  // the placeable modules in words, for error messages

  // A module path that may appear in a placement: a leaf, a block or a group.
  bool placeable(const std::string& path) const;
};

// The layout of a GPT or MobileNetV2; an error naming the model type for anything else.
ModelLayout model_layout(Module& model);

// True when `path` is `ancestor` or lies under it ("h.1.attn" under "h.1", not under "h.10").
bool path_within(const std::string& path, const std::string& ancestor);

}  // namespace mg
