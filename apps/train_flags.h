// The flags every training command has (batch, optimizer, schedule, seed, device, budget, run
// directory, resume, checkpoints, the memory techniques and model parallelism), so `gpt train` and `vision train`
// spell them alike. Values are parsed into TrainOptions' types here, at the command-line edge.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "apps/ddp_setup.h"
#include "apps/model_parallel_flags.h"
#include "apps/technique_flags.h"
#include "apps/training_loop.h"

namespace mg {

// Adds the shared flags to `cmd`. Returns the ones that change the math of a run: with --resume
// the run's config.json fixes them and the command rejects them (reject_on_resume).
inline std::vector<CLI::Option*> add_train_flags(CLI::App* cmd, TrainOptions& t, const std::string& default_out) {
  std::vector<CLI::Option*> fixed = {
      cmd->add_option("--batch", t.batch, "examples per step")->capture_default_str(),
      cmd->add_option_function<std::string>(
             "--optimizer",
             [&t](const std::string& s) { t.optimizer = parse_flag("--optimizer", s, parse_optimizer_kind); },
             "adamw (decoupled weight decay; two f32 state tensors per parameter), adamw8bit (both moments in "
             "8 bits, block-wise) or sgd (with --momentum; --momentum 0 keeps no optimizer state)")
          ->default_str("adamw"),
      cmd->add_option("--lr", t.lr, "peak learning rate (cosine schedule with warmup)")->capture_default_str(),
      cmd->add_option("--weight-decay", t.weight_decay, "weight decay on rank >= 2 parameters")->capture_default_str(),
      cmd->add_option("--momentum", t.momentum, "SGD momentum (0: plain SGD)")->capture_default_str(),
      cmd->add_option("--grad-clip", t.grad_clip, "clip the global gradient norm to this (0: off)")
          ->capture_default_str(),
      cmd->add_option("--warmup", t.warmup, "warmup steps (default: 5% of the steps)"),
      cmd->add_option("--seed", t.seed, "seed of weights, data order and dropout")->capture_default_str(),
      cmd->add_option("--checkpoint-every", t.checkpoint_every, "steps between checkpoints")->capture_default_str(),
      cmd->add_option("--out", t.out, "run directory (default: " + default_out + ")"),
      cmd->add_option("--plan", t.plan,
                      "auto: train with the fastest combination of techniques that `memgrad plan` predicts to fit "
                      "--memory-limit (or a list of candidates in memgrad bench's syntax, e.g. ckpt,bf16+accum4); with "
                      "--devices, splits over them too where that is fastest (each device under its budget: "
                      "--memory-limit cpu:0=500MiB,cpu:1=300MiB); prints it and records it in config.json"),
      cmd->add_option("--plan-calibrate", t.plan_calibrate,
                      "how --plan estimates time: flops (FLOPs and bytes at this machine's rates) or steps (timed "
                      "micro-steps of this model, cached; ranks the candidates better)")->capture_default_str(),
  };
  cmd->add_option("--resume", t.resume, "continue the run in this directory from its checkpoint");
  cmd->add_option("--device", t.device, "device, e.g. cpu:0")->capture_default_str();
  cmd->add_option("--memory-limit", t.memory_limit,
                  "memory budget of the device, e.g. 512MiB; of each device of a split model: cpu:0=200MiB,cpu:1=300MiB "
                  "(one value: every device)");
  for (CLI::Option* f : add_technique_flags(cmd, t.techniques)) fixed.push_back(f);
  for (CLI::Option* f : add_model_parallel_flags(cmd, t.parallel)) fixed.push_back(f);
  add_data_parallel_flags(cmd, t.data_parallel);
  return fixed;
}

}  // namespace mg
