// Split strategies: the placements `--split` names. attention-mlp puts every GPT block's
// attention (ln_1 + attn) on the first device and its feed-forward (ln_2 + mlp) on the second;
// stages:K cuts the blocks into K contiguous groups of equal count; balanced chooses the cut
// points so that the per-device peaks (parameters + gradients + optimizer state + activations)
// measured by running two training steps on meta:1..meta:K are as equal as possible; tensor slices
// every GPT block's projections over all devices (parallel/tensor_parallel.h; not a placement).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "optim/optimizer.h"
#include "parallel/device_memory.h"
#include "parallel/placement.h"

namespace mg {

struct SplitSpec {
  enum class Kind { attention_mlp, stages, balanced, tensor };
  Kind kind = Kind::balanced;
  int64_t stages = 0;  // stages:K only
  // "attention-mlp", "stages:K", "balanced", "tensor"; an error listing them otherwise.
  static SplitSpec parse(const std::string& s);
  std::string str() const;
};

// One training step of a model, on any device, for measuring it on meta: build the model (on
// meta: shapes and bytes only; use a generator of its own), compute one batch's loss with the
// inputs made on the devices the placed model reads them from, and make the optimizer.
struct StepProbe {
  std::function<std::shared_ptr<Module>(Device)> build;
  std::function<Tensor(Module&)> loss;
  std::function<std::unique_ptr<Optimizer>(Module&)> optimizer;
};
// AdamW over weight_decay_groups (lr 3e-4, weight decay 0.01): the workloads' optimizer.
std::unique_ptr<Optimizer> default_optimizer(Module& model);
// GPT: batch x seq token ids on wte's device. MobileNetV2: batch x C x size x size images on the
// stem's device, labels on the classifier's.
StepProbe gpt_step_probe(const GPTConfig& cfg, int64_t batch, int64_t seq,
                         std::function<std::unique_ptr<Optimizer>(Module&)> optimizer = default_optimizer);
StepProbe mobilenet_step_probe(const MobileNetV2Config& cfg, int64_t batch, int64_t size,
                               std::function<std::unique_ptr<Optimizer>(Module&)> optimizer = default_optimizer);

// The placements themselves. `devices` must be distinct; counts[i] blocks go to devices[i].
Placement attention_mlp_placement(const ModelLayout& layout, const std::vector<Device>& devices);
Placement stages_placement(const ModelLayout& layout, const std::vector<Device>& devices,
                           const std::vector<int64_t>& counts);
std::vector<int64_t> equal_counts(int64_t blocks, int64_t parts);  // the first parts get the remainder

// Places the probe's model as `placement` says, with its devices replaced by meta:1, meta:2, ...,
// runs two training steps (forward, backward, optimizer step, zero_grad) and returns each
// device's peak over the second step, labelled with the placement's devices. Leaves the default
// generator where it was.
std::vector<DevicePeak> measure_on_meta(const StepProbe& probe, const Placement& placement);

struct BalancedPlan {
  Placement placement;
  std::vector<int64_t> counts;          // blocks per device
  std::vector<DevicePeak> predicted;    // per device, from meta
  std::vector<int64_t> budgets{};       // what the peaks were balanced against (empty: equal devices)
  int64_t evaluations = 0;              // meta runs the search took
  std::string str() const;              // the cut and the predicted peaks
};
// Starts from equal counts and moves one block at a time across a cut while that lowers the
// largest predicted peak (every candidate measured on meta). With `budgets` (one per device, each
// > 0) it lowers the largest peak as a fraction of its device's budget instead, so a device with
// twice the memory takes about twice the load.
BalancedPlan plan_balanced(const StepProbe& probe, const std::vector<Device>& devices,
                           const std::vector<int64_t>& budgets = {});

// The placement `spec` gives for `model` over `devices` (balanced needs the probe and balances
// against `budgets` when given; *plan, when given, receives its search). Errors: a device listed twice, a split that needs another
// number of devices, more stages than blocks, attention-mlp on a model that is not a GPT, tensor
// (which is applied by apply_tensor_parallel, not as a placement).
Placement split_placement(const SplitSpec& spec, Module& model, const std::vector<Device>& devices,
                          const StepProbe* probe = nullptr, BalancedPlan* plan = nullptr,
                          const std::vector<int64_t>& budgets = {});

// The pipeline stages a placement gives: the runs of consecutive blocks on one device, as block
// counts in forward order (stages:K on K devices -> K stages). Errors: a block whose modules are
// on several devices (attention-mlp), or a model without blocks.
std::vector<int64_t> pipeline_stage_blocks(const ResolvedPlacement& r);

// "cpu:0,cpu:1" -> devices (distinct, at least one).
std::vector<Device> parse_devices(const std::string& s);

}  // namespace mg
