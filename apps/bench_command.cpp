// `memgrad bench --model M --techniques LIST --steps N [--devices D0,D1]`: the table of memory and
// time per combination of techniques (apps/bench.h), also written as bench.csv and bench.html.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "apps/bench.h"
#include "apps/commands.h"
#include "apps/ddp_setup.h"
#include "apps/technique_flags.h"
#include "parallel/split.h"

namespace mg {

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "run one model under combinations of memory techniques and tabulate memory and time");
  cmd->add_option("--model", o->model, "gpt-mini, gpt-small, gpt2-124m, mobilenetv2-32 or mobilenetv2-224")
      ->capture_default_str();
  cmd->add_option("--techniques", o->techniques,
                  "comma-separated combinations of none, ckpt, ckpt-sqrt, ckpt-everyK, selective, bf16, fp16, "
                  "bf16pure, accumN, offload, split=S (attention-mlp, stages:K, balanced, tensor; needs --devices), "
                  "pipeline=gpipe|1f1b (with split= and accumN) joined by '+'")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "training steps per combination (the first is warm-up)")->capture_default_str();
  cmd->add_option("--batch", o->batch, "examples per step (default: the workload's)");
  cmd->add_option("--data", o->data, "text / token file for GPT, fashion-mnist or an image folder for MobileNetV2");
  cmd->add_option("--device", o->device, "device, e.g. cpu:0")->capture_default_str();
  cmd->add_option_function<std::string>(
      "--devices", [o](const std::string& s) { o->devices = parse_flag("--devices", s, parse_devices); },
      "devices the split= combinations cut the model over, e.g. cpu:0,cpu:1 (a peak column per device)");
  cmd->add_option("--seed", o->seed, "seed of every run")->capture_default_str();
  cmd->add_option("--out", o->out, "folder for bench.csv, bench.html and the runs (default: runs/bench-<model>-<time>)");
  add_data_parallel_flags(cmd, o->data_parallel);
  cmd->callback([o] {
    BenchResult r = run_bench(*o);
    if (o->data_parallel.enabled && launch_info_from_env().rank != 0) return;  // rank 0 reports
    std::printf("%s", r.table().c_str());
    std::printf("wrote %s/bench.csv and %s/bench.html\n", r.out_dir.c_str(), r.out_dir.c_str());
  });
}

}  // namespace mg
