// The command-line flags of model parallelism, shared by `gpt train` and `vision train`:
// --devices, --split, --placement, --pipeline and --print-schedule, each parsed here into its
// type (apps/model_parallel_options.h); a bad value is an error naming the flag. How the flags
// combine is checked by ModelParallelOptions::validate.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "apps/model_parallel_options.h"
#include "apps/technique_flags.h"

namespace mg {

// Adds the flags; returns those a resumed run takes from its config.json (all but
// --print-schedule).
inline std::vector<CLI::Option*> add_model_parallel_flags(CLI::App* cmd, ModelParallelOptions& p) {
  cmd->add_flag("--print-schedule", p.print_schedule,
                "print the pipeline's schedule (stage by time slot) and its bubble before training");
  return {
      cmd->add_option_function<std::string>(
          "--devices", [&p](const std::string& s) { p.devices = parse_flag("--devices", s, parse_devices); },
          "devices to split the model over with --split, e.g. cpu:0,cpu:1 (two cpu indices behave like two cards), "
          "or that --plan may split it over"),
      cmd->add_option_function<std::string>(
          "--split", [&p](const std::string& s) { p.split = parse_flag("--split", s, SplitSpec::parse); },
          "how to cut the model over --devices: attention-mlp (GPT: attention on the first device, feed-forward on "
          "the second), stages:K (K equal groups of blocks), balanced (cut points that equalise the per-device "
          "peaks measured on meta) or tensor (GPT: every block's heads and MLP sliced over all devices, Megatron-style)"),
      cmd->add_option_function<std::string>(
          "--placement", [&p](const std::string& s) { p.placement = parse_flag("--placement", s, Placement::parse); },
          "an explicit map of module paths to devices, e.g. 'wte,wpe,h.0-5=cpu:0;h.6-11,ln_f=cpu:1'"),
      cmd->add_option_function<std::string>(
          "--pipeline", [&p](const std::string& s) { p.pipeline = parse_flag("--pipeline", s, parse_pipeline); },
          "run the micro-batches (--micro-batch) through the stages: gpipe (all forwards, then all backwards) or "
          "1f1b (one forward one backward; fewer activations held)"),
  };
}

}  // namespace mg
