// The memory techniques a training command switches on, as typed values: parsed once from the
// command line (apps/technique_flags.h), recorded in the run's config.json so a resumed run uses
// the same ones, and handed to the Trainer and the models as their own types. Auto-fit and
// profiling are settings of the process, not of the run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "autograd/checkpoint.h"
#include "core/device.h"
#include "optim/precision.h"
#include "optim/trainer.h"

namespace mg {

struct TechniqueOptions {
  CheckpointPolicy checkpoint{};                  // activation checkpointing (none: every activation saved)
  Precision precision = Precision::fp32;
  int64_t micro_batch = 0;                        // 0: the whole batch
  bool auto_fit = false;                          // on out-of-memory: the planner's next plan (apps/run_plan.h), or half the micro-batch; retry
  std::optional<Device> offload_activations{};    // park saved activations on this device until backward
  // Record the second step of this process (the first when only one runs) and write memory.json
  // and memory.html into the run directory.
  bool profile = false;

  // Throws naming the flag when a value does not fit the run: `batch` bounds the micro-batch, the
  // offload target must be another device with data than `train_device`.
  void validate(int64_t batch, const Device& train_device) const;
  TrainerOptions trainer_options(double grad_clip) const;
  // "checkpoint=blocks bf16 micro-batch=2 ..." for log lines; "none" when nothing is on.
  std::string str() const;
  // The run's settings (checkpoint, precision, micro_batch, offload_activations) for config.json.
  nlohmann::json to_json() const;
  // These techniques with the process's own settings (auto_fit, profile) taken from `process`.
  TechniqueOptions with_process_settings(const TechniqueOptions& process) const;
  // The run's techniques from config.json (missing: all off); auto_fit and profile come from `*this`.
  TechniqueOptions from_config(const nlohmann::json& config) const;
};

}  // namespace mg
