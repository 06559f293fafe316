// `memgrad prune`: the command line over apps/prune_run.h. Prunes a trained run (gpt train or
// vision train) structurally (a smaller dense model) or by magnitude (masks, weights stored
// sparse) into a new run directory, optionally fine-tunes and benchmarks it, and prints the
// parameters, the allocator's parameter bytes and the quality before and after. With --sweep it
// prunes at every listed amount and prints (and writes as sweep.csv / sweep.html) the curve.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "apps/prune_run.h"
#include "apps/prune_sweep.h"

namespace mg {

void add_prune_command(CLI::App& app) {
  auto o = std::make_shared<PruneOptions>();
  auto sweep = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("prune", "Prune a trained run into a smaller (or sparse) run directory");
  cmd->add_option("--run", o->run, "the trained run directory (gpt train or vision train)")->required();
  cmd->add_option("--out", o->out, "the new run directory")->required();
  cmd->add_option("--method", o->method, "structured (units removed), unstructured (weights zeroed, stored sparse) or 2:4 "
                  "(2 of every 4 weights zeroed, stored 2:4 and run by the 2:4 kernel)")
      ->capture_default_str();
  cmd->add_option("--amount", o->amount, "fraction removed, in [0, 1)")->capture_default_str();
  cmd->add_option("--criterion", o->criterion, "importance: l1, l2, bn (BatchNorm scale), taylor (|grad x weight|)")
      ->capture_default_str();
  cmd->add_option("--scope", o->scope, "layer (the same fraction of every layer) or global")->capture_default_str();
  cmd->add_option("--target", o->target, "what structured pruning removes: GPT mlp (default), heads or mlp+heads; "
                  "MobileNetV2 expansion (default)");
  cmd->add_option("--taylor-batches", o->taylor_batches, "training batches the taylor criterion reads")
      ->capture_default_str();
  cmd->add_option("--finetune-steps", o->finetune_steps, "training steps after pruning (continues the run)")
      ->capture_default_str();
  cmd->add_option("--finetune-lr", o->finetune_lr, "> 0: fine-tune on a fresh cosine from this learning rate down to "
                  "the run's min/peak ratio; 0: the run's own schedule, stretched to end with the fine-tune")
      ->capture_default_str();
  cmd->add_option("--schedule", o->schedule, "unstructured: oneshot, or gradual (Zhu & Gupta's cubic sparsity ramp "
                  "over the first 3/4 of --finetune-steps)")->capture_default_str();
  cmd->add_option("--distill", o->distill, "> 0: the fine-tune learns from the unpruned run too (knowledge "
                  "distillation; vision runs): this weight on matching its softened outputs, the rest on the labels")
      ->capture_default_str();
  cmd->add_option("--distill-temperature", o->distill_temperature, "the softmax temperature of --distill")
      ->capture_default_str();
  cmd->add_option("--bench-steps", o->bench_steps, "> 0: train both models this many steps; peak memory and step time")
      ->capture_default_str();
  cmd->add_option("--sweep", *sweep, "amounts, e.g. 0,0.25,0.5,0.75: prune at each into --out/amount-<a>, fine-tune, "
                  "bench; writes --out/sweep.csv and sweep.html (--amount is ignored)");
  cmd->callback([o, sweep] {
    if (sweep->empty()) std::fputs(prune_report(prune_run(*o)).c_str(), stdout);
    else std::fputs(prune_sweep(*o, parse_sweep(*sweep)).table().c_str(), stdout);
  });
}

}  // namespace mg
