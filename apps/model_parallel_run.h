// A training command's model placed on its devices before the loop starts (parallel/): the
// placement --split or --placement gives (balanced: cut points searched on meta), the per-device
// budgets of --memory-limit, the pipeline's stages and schedule, and the lines the log prints
// about them. The loop reads it for per-device peaks and the pipelined step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/model_parallel_options.h"
#include "apps/technique_options.h"
#include "models/nn/module.h"
#include "optim/precision.h"
#include "parallel/device_memory.h"
#include "parallel/placement.h"
#include "parallel/schedule.h"
#include "parallel/split.h"

namespace mg {

struct ModelParallelRun {
  ResolvedPlacement placement;
  std::vector<Device> devices;                // where the model lives, in placement order
  std::vector<DevicePeak> predicted{};         // balanced: each device's peak predicted on meta
  std::vector<int64_t> stage_blocks{};         // --pipeline: blocks per stage, in forward order
  std::optional<PipelineSchedule> schedule{};  // --pipeline over the run's micro-batches
  std::vector<std::string> notes{};            // placement, predicted peaks, budgets, schedule
  Device input_device() const { return placement.input_device(); }
  Device output_device() const { return placement.output_device(); }
};

// Places `model` as `o` says; nothing when the model is not split. Call once the model is built
// (on the first device, precision and checkpoint policy applied) and before the optimizer exists.
// `probe` measures a step of the same model on meta (needed by balanced; it should apply the
// run's precision, checkpointing and optimizer: with_run_techniques). `memory_limit` is
// --memory-limit: per device or one value for every device; a device's budget is set before
// modules move onto it (the model's own device's once the others' modules left), and a budget the
// placed modules already exceed is an out-of-memory error; balanced balances each device's peak
// against its budget when every device has one (o.balance_budgets first). `batch` and `micro_batch` size the
// pipeline's schedule.
std::optional<ModelParallelRun> place_model(const ModelParallelOptions& o, Module& model, const StepProbe& probe,
                                            const std::string& memory_limit, int64_t batch, int64_t micro_batch);

// `probe` (gpt_step_probe, mobilenet_step_probe) with the run's precision and checkpoint policy
// applied to every model it builds. Model: GPT or MobileNetV2 (anything with set_checkpoint).
template <class Model>
StepProbe with_run_techniques(StepProbe probe, const TechniqueOptions& t) {
  probe.build = [build = probe.build, t](Device d) {
    std::shared_ptr<Module> m = build(d);
    apply_precision(*m, t.precision);
    static_cast<Model&>(*m).set_checkpoint(t.checkpoint);
    return m;
  };
  return probe;
}

}  // namespace mg
