// The planner (apps/plan.h) applied to a training run. `--plan auto` plans the command's own model,
// batch, optimizer, device and budget before the run starts and makes the fastest combination
// predicted to fit the run's techniques; the run prints it and records it in config.json
// ("plan", and "techniques" as for any run), so --resume restores it. `--auto-fit` asks the same
// planner for the next plan after an out-of-memory error (AutoFit below).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/cost_model.h"
#include "apps/model_parallel_run.h"
#include "apps/plan.h"
#include "apps/plan_step.h"
#include "apps/technique_options.h"

namespace mg {

// A plan chosen for a run: bench's name of the combination, its techniques and what the planner
// predicts for it.
struct RunPlan {
  std::string combination;
  TechniqueOptions techniques{};
  OptimizerKind optimizer = OptimizerKind::adamw;  // the run's, or adam8bit's when the plan names it
  ModelParallelOptions parallel{};  // a split plan's split over the run's --devices (inactive: one device)
  int64_t peak_bytes = 0;        // predicted peak allocated bytes of a step (exact on cpu; a split: its fullest device)
  double ms_per_step = 0.0;      // the time model's estimate
  bool from_steps = false;       // that estimate from timed micro-steps (--plan-calibrate steps)
  int64_t budget = 0;            // the budget it was chosen for (--device's)
  std::string budgets{};         // every device's, as memgrad plan prints them ("450.00 MiB", "cpu:0 ..., cpu:1 ...")
  int64_t candidates = 0, fitting = 0;

  // "ckpt+accum4: predicted peak 65.04 MiB of 80.00 MiB, 514.6 ms/step (the fastest of the 20 of
  // 26 candidates that fit)"
  std::string str() const;
  nlohmann::json to_json() const;
};

// What the planner measures for a training run of this model with these options: the batch, the
// optimizer, gradient clipping and the loaders' prefetch of 2 batches.
PlanWorkload run_workload(const TrainOptions& o, const std::string& name, const std::optional<GPTConfig>& gpt,
                          const std::optional<MobileNetV2Config>& mobilenet);

// o.plan for workload `w`: "auto" plans memgrad plan's default candidates (with --devices, its
// split candidates over them too, each device under its --memory-limit budget), a list in bench's
// syntax plans those. Throws, naming `cmd`: without --memory-limit, with a technique flag that
// --plan chooses itself, with a split given by hand (--split, --placement) or a data-parallel
// run, and when no candidate fits (naming the least any needs and what lowers it).
RunPlan plan_run(const std::string& cmd, const TrainOptions& o, const PlanWorkload& w);
// Makes `plan` the run's: its techniques (with o's process settings), optimizer and split; a plan
// on one device keeps only --device's budget of a per-device --memory-limit.
void apply_plan(const RunPlan& plan, TrainOptions& o);

// This machine's time-model rates for a run that plans (--plan or --auto-fit on a cpu device), read
// or measured before the run's budget applies (the measurement allocates); none otherwise.
std::optional<Calibration> planning_rates(const TrainOptions& o, const Device& device);

// --auto-fit's planner: after an attempt runs out of memory under the device's budget, the fastest
// plan predicted to fit it with a lower predicted peak than the current one, among those a running
// run can switch to without touching its parameters or optimizer: every checkpoint policy, bf16
// autocast (from fp32), activation offload and accumulation over 1, 2, 4, ... micro-batches.
// A split run (`placement`: where its modules live, which a switch does not move) plans the same
// candidates but offload under that placement, each device under its own budget, and a lower
// predicted peak means a lower largest peak / budget of its budgeted devices.
class AutoFit {
 public:
  AutoFit(PlanWorkload workload, Device device, Calibration rates, std::optional<Placement> placement = std::nullopt);
  // The plan to switch to from `current` (whose attempt used micro-batch `micro`), or none (the
  // Trainer then halves the micro-batch, as without a planner).
  std::optional<RunPlan> next(const TechniqueOptions& current, int64_t micro) const;
  // The switchable candidates for a run in `precision`, in bench's syntax.
  std::string candidates(Precision precision) const;

 private:
  std::optional<RunPlan> next_split(const TechniqueOptions& current, int64_t micro) const;
  // The candidates for a run in `precision` planned under `limits` (--memory-limit's syntax), over
  // the placement of a split run; none when no plan can fit (a budget below the parameters alone).
  std::optional<Plan> plan_under(const std::string& limits, Precision precision) const;

  PlanWorkload workload_;
  Device device_;
  Calibration rates_;
  std::optional<Placement> placement_;
};

// The placement --auto-fit keeps for a split run: every leaf module where the run placed it (a
// balanced cut as it was cut); none for a run on one device or sliced by --split tensor (whose
// auto-fit halves the micro-batch).
std::optional<Placement> auto_fit_placement(const ModelParallelOptions& o, const ModelParallelRun* run);

}  // namespace mg
