// The command-line flags of the memory techniques, shared by `gpt train`, `vision train` and
// `memgrad bench` so every command spells them alike. Each value is parsed here, at the edge,
// into its type (CheckpointPolicy, Precision, Device); a bad value is an error naming the flag.
// What depends on the batch and the device is checked by TechniqueOptions::validate.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "apps/technique_options.h"
#include "core/error.h"

namespace mg {

// parse(text) for `flag`, with a library error turned into one that names the flag.
template <typename Parse>
auto parse_flag(const std::string& flag, const std::string& text, Parse&& parse) {
  try {
    return parse(text);
  } catch (const Error& e) {
    throw CLI::ValidationError(flag, e.what());
  }
}

// Adds --checkpoint, --precision, --micro-batch, --offload-activations (returned: a resumed run
// keeps its own and rejects them), --auto-fit and --profile (settings of this process, allowed
// on resume).
inline std::vector<CLI::Option*> add_technique_flags(CLI::App* cmd, TechniqueOptions& t) {
  cmd->add_flag("--auto-fit", t.auto_fit,
                "on out-of-memory, switch to the planner's fastest plan predicted to fit the budget (on cpu:N: "
                "checkpointing, bf16, offload, accumulation; a split model keeps its placement), else halve the "
                "micro-batch (doubling accumulation), and retry the same batch");
  cmd->add_flag("--profile", t.profile,
                "record every allocation of the second step; write memory.json and memory.html into the run dir");
  return {
      cmd->add_option_function<std::string>(
             "--checkpoint",
             [&t](const std::string& s) { t.checkpoint = parse_flag("--checkpoint", s, CheckpointPolicy::parse); },
             "activation checkpointing: none, blocks, every:K, sqrt or selective")
          ->default_str("none"),
      cmd->add_option_function<std::string>(
             "--precision", [&t](const std::string& s) { t.precision = parse_flag("--precision", s, parse_precision); },
             "fp32, bf16 or fp16 (autocast), bf16-pure")
          ->default_str("fp32"),
      cmd->add_option("--micro-batch", t.micro_batch,
                      "examples per forward/backward; gradients accumulate over the batch (0: whole batch)")
          ->capture_default_str(),
      cmd->add_option_function<std::string>(
          "--offload-activations",
          [&t](const std::string& s) {
            t.offload_activations = parse_flag("--offload-activations", s, [](const std::string& d) { return Device(d); });
          },
          "keep saved activations on this device until backward, e.g. cpu:1"),
  };
}

}  // namespace mg
