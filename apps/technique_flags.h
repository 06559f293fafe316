// The command-line flags of the memory techniques, shared by `gpt train`, `vision train` and
// `memgrad bench` so every command spells them alike (values are checked by
// TechniqueOptions::validate once the batch and the device are known).
#pragma once
#include <CLI/CLI.hpp>
#include <vector>

#include "apps/train_common.h"

namespace mg {

// Adds --checkpoint, --precision, --micro-batch, --offload-activations (returned: a resumed run
// keeps its own and rejects them), --auto-fit and --profile (settings of this process, allowed
// on resume).
inline std::vector<CLI::Option*> add_technique_flags(CLI::App* cmd, TechniqueOptions& t) {
  cmd->add_flag("--auto-fit", t.auto_fit,
                "on out-of-memory, halve the micro-batch (doubling accumulation) and retry the same batch");
  cmd->add_flag("--profile", t.profile,
                "record every allocation of the second step; write memory.json and memory.html into the run dir");
  return {
      cmd->add_option("--checkpoint", t.checkpoint,
                      "activation checkpointing: none, blocks, every:K, sqrt or selective")
          ->capture_default_str(),
      cmd->add_option("--precision", t.precision, "fp32, bf16 or fp16 (autocast), bf16-pure")->capture_default_str(),
      cmd->add_option("--micro-batch", t.micro_batch,
                      "examples per forward/backward; gradients accumulate over the batch (0: whole batch)")
          ->capture_default_str(),
      cmd->add_option("--offload-activations", t.offload_activations,
                      "keep saved activations on this device until backward, e.g. cpu:1"),
  };
}

}  // namespace mg
