// Structured pruning that frees bytes: whole expansion channels of MobileNetV2's inverted
// residual blocks, whole MLP units and attention heads of GPT are cut out of the tensors, and the
// result is a smaller dense model built from a config that records the new widths
// (MobileNetV2Config::block_hidden, GPTConfig::mlp_hidden / layer_heads). Unlike a mask
// (torch.nn.utils.prune), every parameter, gradient, optimizer-state and activation byte of a
// removed unit is gone, and the GEMMs get smaller. The optimizer's state can be cut the same way
// (apply_plan on "<param>.exp_avg", ...), so fine-tuning continues from the trained moments.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/compress/importance.h"
#include "models/compress/prune_groups.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"

namespace mg {

// The dependency groups: one per inverted-residual block with an expansion conv (16 of 17).
std::vector<PruneGroup> mobilenet_v2_groups(const MobileNetV2Config& cfg);
// One "mlp" group per block when `mlp`, one "heads" group per block when `heads`.
std::vector<PruneGroup> gpt_groups(const GPTConfig& cfg, bool mlp, bool heads);

struct PrunePlan {
  std::vector<PruneGroup> groups;
  std::vector<std::vector<int64_t>> keep;  // per group, the units kept (ascending)
};

// Scores every group of `model` by the criterion and keeps the most important units
// (importance.h). taylor: the scores from taylor_importance.
PrunePlan plan_pruning(const Module& model, std::vector<PruneGroup> groups, double amount, PruneCriterion criterion,
                       PruneScope scope, const GroupScores* taylor = nullptr);

// `state` (a model's state dict, which must hold every member) with every member of every group
// sliced to the kept units; everything else is passed through (aliases, no copy). cpu tensors.
NamedTensors apply_plan(const PrunePlan& plan, const NamedTensors& state);
// The same for an optimizer's state: "<member>.<suffix>" tensors of the member's shape (exp_avg,
// exp_avg_sq, master) are sliced, the rest ("<member>.step") passed through; a parameter may
// have no state yet.
NamedTensors apply_plan_to_optimizer_state(const PrunePlan& plan, const NamedTensors& state);

// Zeroes the parameters of the units the plan removes, in place (the "masked model" that must
// compute what the pruned one computes).
void mask_plan(const PrunePlan& plan, Module& model);

// The configs of the pruned models (the widths of the plan's groups written in).
MobileNetV2Config pruned_config(const MobileNetV2Config& cfg, const PrunePlan& plan);
GPTConfig pruned_config(const GPTConfig& cfg, const PrunePlan& plan);

// The pruned model, built on `model`'s device from pruned_config and loaded with the kept weights
// (and buffers). Its parameters are allocated under MemoryCategory::parameter as any model's.
std::unique_ptr<MobileNetV2> prune_model(const MobileNetV2& model, const PrunePlan& plan);
std::unique_ptr<GPT> prune_model(const GPT& model, const PrunePlan& plan);

// Parameter and buffer elements before and after the plan (counted from shapes, no data read).
struct PruneCount {
  int64_t elements_before = 0, elements_after = 0;
};
PruneCount count_pruned(const PrunePlan& plan, const NamedTensors& state);

}  // namespace mg
