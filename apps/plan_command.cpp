// `memgrad plan --model M --batch B [--memory-limit X] [--techniques LIST] [--devices D0,D1] [--json] [--verify]`:
// the exact memory of each combination of techniques from one step on meta (a split: on each of
// its devices), whether it fits the budget, its estimated step time, and the recommended
// combination (apps/plan.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "apps/plan.h"
#include "apps/technique_flags.h"
#include "parallel/split.h"

namespace mg {

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "plan", "the exact peak memory of every combination of techniques (from one step on meta), what fits a budget, "
              "and the fastest that fits");
  cmd->add_option("--model", o->model, "gpt-mini, gpt-small, gpt2-124m, mobilenetv2-32 or mobilenetv2-224")
      ->capture_default_str();
  cmd->add_option("--batch", o->batch, "examples per step (default: the workload's: 8 for GPT, 64 / 32 for MobileNetV2)");
  cmd->add_option("--device", o->device, "the device the run would train on (cpu:N)")->capture_default_str();
  cmd->add_option_function<std::string>(
      "--devices", [o](const std::string& s) { o->devices = parse_flag("--devices", s, parse_devices); },
      "devices the split= candidates cut the model over, e.g. cpu:0,cpu:1 (each device's peaks under its row; "
      "one --memory-limit value is then every device's budget)");
  cmd->add_option("--ranks", o->ranks,
                  "add data-parallel candidates over this many ranks (ddp=N, zero1=N, zero2=N, ckpt+zero2=N, "
                  "bf16+zero2=N: each rank on a device of its own, --memory-limit each rank's budget)");
  cmd->add_option("--bucket-mb", o->bucket_mb, "the data-parallel rows' gradient bucket size in MiB, as training's --bucket-mb")
      ->capture_default_str();
  cmd->add_option("--memory-limit", o->memory_limit,
                  "the budget, e.g. 512MiB or 24GiB for every device, or per device cpu:0=200MiB,cpu:1=300MiB (a "
                  "device not named has none; default: none)");
  cmd->add_option("--techniques", o->techniques,
                  "the candidates in memgrad bench's syntax, e.g. none,ckpt,bf16+accum8,split=balanced,zero2=4 (default: every checkpoint "
                  "policy x precision x {no accumulation, accum4}, and offload)");
  cmd->add_option("--optimizer", o->optimizer, "adamw, adamw8bit or sgd")->capture_default_str();
  cmd->add_flag("--json", *json, "print the rows as a JSON list instead of the table");
  cmd->add_flag("--verify", o->verify, "also run every candidate for --verify-steps steps: measured vs estimated");
  cmd->add_option("--verify-steps", o->verify_steps, "steps per verified candidate (the first is warm-up)")
      ->capture_default_str();
  cmd->add_option("--verify-rounds", o->verify_rounds,
                  "--verify's time is the median over this many rounds of every candidate in turn")
      ->capture_default_str();
  cmd->add_option("--calibrate", o->calibrate,
                  "the time estimate: flops (FLOPs and created elements at measured rates, instant) or steps (timed "
                  "micro-steps of the real model per shape of work, cached: for sizes this machine runs)")
      ->capture_default_str();
  cmd->add_option("--clock", o->clock,
                  "what --calibrate steps and --verify time: wall (wall-clock) or cpu (the process's CPU time, "
                  "steadier when other processes share the cores; with 1 thread it is the idle machine's step time)")
      ->capture_default_str();
  cmd->add_option("--calibrate-rounds", o->calibrate_rounds,
                  "--calibrate steps: each piece is the median of this many interleaved rounds")
      ->capture_default_str();
  cmd->callback([o, json] {
    // Under mpirun -np N: every rank times the collectives on one bucket, then rank 0 alone plans.
    if (launch_info_from_env().world_size > 1) {
      const std::shared_ptr<ProcessGroup> group = ProcessGroup::world();
      CollectiveRates rates = CollectiveRates::measure(*group, o->bucket_mb);
      if (group->rank() != 0) return;
      rates.save();
      o->collectives = rates;
    }
    const Plan p = make_plan(*o);
    if (*json) std::printf("%s\n", p.to_json().dump(2).c_str());
    else std::printf("%s", p.table().c_str());
  });
}

}  // namespace mg
