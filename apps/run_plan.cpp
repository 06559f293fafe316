// --plan and --auto-fit's planner for training runs (see run_plan.h).
#include "apps/run_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "apps/plan.h"
#include "core/allocator.h"
#include "core/error.h"

namespace mg {

namespace {

RunPlan plan_of(const Plan& p, const PlanRow& row) {
  RunPlan r{.combination = row.combination.name,
            .techniques = row.combination.techniques,
            .optimizer = row.combination.optimizer_for(p.workload.optimizer),
            .parallel = row.combination.parallel,
            .peak_bytes = row.memory.peak,
            .ms_per_step = row.estimated_ms,
            .from_steps = row.from_steps,
            .budget = p.budget,
            .budgets = p.budget_str(),
            .candidates = int64_t(p.rows.size()),
            .fitting = 0};
  for (const PlanRow& x : p.rows) r.fitting += x.fits;
  return r;
}

// --memory-limit as --device alone sees it: a per-device spec becomes that device's budget ("" when
// it has none); one value stays as it is.
std::string device_budget(const TrainOptions& o) {
  if (o.memory_limit.find('=') == std::string::npos) return o.memory_limit;
  const int64_t budget = limit_of(parse_memory_limits(o.memory_limit, o.budgeted_devices()), Device(o.device));
  return budget > 0 ? std::to_string(budget) : std::string();
}

// `row` of `p` as the plan a running run switches to, with the run's process settings.
RunPlan switched_plan(const Plan& p, const PlanRow& row, const TechniqueOptions& current) {
  RunPlan r = plan_of(p, row);
  r.techniques.auto_fit = current.auto_fit;
  r.techniques.profile = current.profile;
  return r;
}

}  // namespace

std::string RunPlan::str() const {
  char line[256];
  std::snprintf(line, sizeof line,
                "%s: predicted peak %s of %s, %.1f ms/step %s(the fastest estimate of the %lld of %lld candidates that "
                "fit)",
                combination.c_str(), format_bytes(peak_bytes).c_str(),
                budgets.empty() ? format_bytes(budget).c_str() : budgets.c_str(), ms_per_step,
                from_steps ? "from timed micro-steps " : "",
                (long long)fitting, (long long)candidates);
  return line;
}

nlohmann::json RunPlan::to_json() const {
  return {{"combination", combination}, {"predicted_peak_bytes", peak_bytes}, {"predicted_ms_per_step", ms_per_step},
          {"predicted_ms_from", from_steps ? "steps" : "flops"},
          {"budget_bytes", budget},     {"budgets", budgets},               {"candidates", candidates},
          {"fitting", fitting},
          {"summary", str()}};
}

PlanWorkload run_workload(const TrainOptions& o, const std::string& name, const std::optional<GPTConfig>& gpt,
                          const std::optional<MobileNetV2Config>& mobilenet) {
  PlanWorkload w;
  w.name = name;
  w.gpt = gpt;
  w.mobilenet = mobilenet;
  w.batch = o.batch;
  w.optimizer = o.optimizer;
  w.momentum = o.momentum;
  w.grad_clip = o.grad_clip;
  w.prefetch = 2;  // gpt train's and vision train's loaders
  return w;
}

RunPlan plan_run(const std::string& cmd, const TrainOptions& o, const PlanWorkload& w) {
  const TechniqueOptions& t = o.techniques;
  MG_CHECK(!t.checkpoint.enabled() && t.precision == Precision::fp32 && t.micro_batch == 0 && !t.offload_activations,
           cmd, ": --plan ", o.plan, " chooses checkpointing, precision, micro-batch and offload itself, so it does not "
           "combine with --checkpoint, --precision, --micro-batch or --offload-activations (got ", t.str(), ")",
           "\n  hint: drop those flags, or list the combinations you accept: --plan ckpt,bf16+accum4 (memgrad bench's "
           "syntax)");
  MG_CHECK(!o.parallel.active(), cmd, ": --plan chooses the split itself; give --devices without --split or "
           "--placement (or drop --plan and choose the techniques by hand)");
  MG_CHECK(!o.data_parallel.enabled, cmd, ": --plan does not plan data-parallel (--ddp) runs; choose their "
           "techniques by hand");
  const Device device(o.device);
  MG_CHECK(!parse_memory_limits(o.memory_limit, o.budgeted_devices()).empty(), cmd, ": --plan ", o.plan,
           " needs --memory-limit: the budget the plan must fit",
           "\n  hint: `memgrad plan --model M --batch B` prints every candidate's memory without a budget");
  PlanOptions po;
  po.workload = w;
  po.device = device.str();
  // The devices split candidates cut over: auto's defaults add them; a list only when it splits.
  if (o.plan == "auto" || o.plan.find("split=") != std::string::npos) po.devices = o.parallel.devices;
  po.memory_limit = o.memory_limit;
  if (po.devices.empty()) po.memory_limit = device_budget(o);  // one device: its budget only
  po.techniques = o.plan == "auto" ? std::string() : o.plan;
  po.optimizer = optimizer_kind_name(o.optimizer);
  MG_CHECK(o.plan_calibrate == "flops" || o.plan_calibrate == "steps", cmd, ": --plan-calibrate must be flops or "
           "steps, got '", o.plan_calibrate, "'");
  po.calibrate = o.plan_calibrate;
  Plan p;
  try {
    p = make_plan(po);
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const Error& e) {  // a budget below the parameters, a bad candidate list, a cuda device
    MG_THROW(cmd, ": --plan ", o.plan, ": ", e.what());
  }
  if (o.plan_calibrate == "steps") empty_cache(device);  // the timed micro-steps' blocks: not the run's
  MG_CHECK(p.recommended >= 0, cmd, ": --plan ", o.plan, ": ", p.nothing_fits());
  return plan_of(p, p.rows[size_t(p.recommended)]);
}

void apply_plan(const RunPlan& plan, TrainOptions& o) {
  o.techniques = plan.techniques.with_process_settings(o.techniques);
  o.optimizer = plan.optimizer;  // adam8bit when the plan chose it (config.json records it)
  if (plan.parallel.active()) {
    o.parallel.split = plan.parallel.split;
    o.parallel.placement = plan.parallel.placement;
    return;
  }
  o.memory_limit = device_budget(o);
  o.parallel.devices.clear();  // one device: --devices was only what the plan could split over
}

std::optional<Calibration> planning_rates(const TrainOptions& o, const Device& device) {
  // A split run plans only for --auto-fit (--plan refuses a split given by hand), not when sliced
  // by --split tensor (auto_fit_placement).
  const bool split = o.parallel.active();
  const bool tensor = o.parallel.split && o.parallel.split->kind == SplitSpec::Kind::tensor;
  if ((o.plan.empty() && !o.techniques.auto_fit) || !device.is_cpu() || o.data_parallel.enabled ||
      (split && (tensor || !o.plan.empty())))
    return std::nullopt;
  for (const Device& d : o.parallel.model_devices())
    if (!d.is_cpu()) return std::nullopt;
  Calibration c = Calibration::of_this_machine();
  if (!c.cached) empty_cache(kCPU);  // the measurement's blocks: not the run's
  return c;
}

AutoFit::AutoFit(PlanWorkload workload, Device device, Calibration rates, std::optional<Placement> placement)
    : workload_(std::move(workload)), device_(device), rates_(std::move(rates)), placement_(std::move(placement)) {}

std::optional<Placement> auto_fit_placement(const ModelParallelOptions& o, const ModelParallelRun* run) {
  if (!run || (o.split && o.split->kind == SplitSpec::Kind::tensor)) return std::nullopt;
  return Placement{.entries = run->placement.leaves};
}

std::string AutoFit::candidates(Precision precision) const {
  std::vector<std::string> precisions;
  switch (precision) {
    case Precision::fp32: precisions = {"", "bf16"}; break;
    case Precision::bf16: precisions = {"bf16"}; break;
    case Precision::fp16: precisions = {"fp16"}; break;
    case Precision::bf16_pure: precisions = {"bf16pure"}; break;
  }
  std::vector<std::string> accums{""};
  for (int64_t n = 2; n <= workload_.batch; n *= 2)
    if (workload_.batch % n == 0) accums.push_back("accum" + std::to_string(n));
  std::string list;
  for (const char* ckpt : {"", "ckpt", "ckpt-sqrt", "selective"})
    for (const std::string& prec : precisions)
      for (const std::string& acc : accums)
        for (const char* off : {"", "offload"}) {
          if (placement_ && *off) continue;  // a split model does not offload activations
          std::string name;
          for (const std::string& part : {std::string(ckpt), prec, acc, std::string(off)})
            if (!part.empty()) {
              if (!name.empty()) name += '+';
              name += part;
            }
          if (!list.empty()) list += ',';
          list += name.empty() ? std::string("none") : name;
        }
  return list;
}

std::optional<RunPlan> AutoFit::next(const TechniqueOptions& current, int64_t micro) const {
  if (placement_) return next_split(current, micro);
  const int64_t budget = int64_t(memory_limit(device_));
  if (budget <= 0) return std::nullopt;  // the device itself ran out: nothing to plan against
  // The current plan as the planner sees it (the Trainer's own auto-fit snapshot aside).
  TechniqueOptions now = current;
  now.auto_fit = false;
  now.profile = false;
  now.micro_batch = micro < workload_.batch ? micro : 0;
  const Device meta(DeviceType::meta, 0);
  const int64_t now_peak = measure_step(workload_, now, meta).memory.peak;
  const std::optional<Plan> p = plan_under(std::to_string(budget), current.precision);
  if (!p) return std::nullopt;
  // Only a lower predicted peak than the plan that just failed is progress (and ends the search).
  const PlanRow* best = nullptr;
  for (const PlanRow& r : p->rows)
    if (r.fits && r.memory.peak < now_peak && (!best || r.estimated_ms < best->estimated_ms)) best = &r;
  if (!best) return std::nullopt;
  return switched_plan(*p, *best, current);
}

std::optional<Plan> AutoFit::plan_under(const std::string& limits, Precision precision) const {
  PlanOptions po;
  po.workload = workload_;
  po.device = device_.str();
  if (placement_) {
    po.devices = placement_->devices();
    po.placement = placement_;
  }
  po.memory_limit = limits;
  po.techniques = candidates(precision);
  po.optimizer = optimizer_kind_name(workload_.optimizer);
  po.calibration = rates_;
  try {
    return make_plan(po);
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const Error&) {  // a budget below the parameters alone: no plan fits
    return std::nullopt;
  }
}

std::optional<RunPlan> AutoFit::next_split(const TechniqueOptions& current, int64_t micro) const {
  const std::vector<Device> devices = placement_->devices();
  std::string limits;  // every budgeted device's budget, as --memory-limit gives them
  for (const Device& d : devices)
    if (const size_t b = memory_limit(d); b > 0) {
      if (!limits.empty()) limits += ',';
      limits += d.str();
      limits += '=';
      limits += std::to_string(b);
    }
  if (limits.empty()) return std::nullopt;  // a device itself ran out: nothing to plan against
  const std::optional<Plan> plan = plan_under(limits, current.precision);
  if (!plan) return std::nullopt;
  const Plan& p = *plan;
  // A row's fullest budgeted device, as a fraction of its budget.
  auto pressure = [&](const PlanRow& r) {
    double worst = 0;
    for (const StepMeasurement::DeviceMemory& d : r.devices)
      if (const int64_t b = p.budget_of(d.device); b > 0) worst = std::max(worst, double(d.memory.peak) / double(b));
    return worst;
  };
  // The current plan is among the candidates when its micro-batch is one of theirs; only a lower
  // pressure than its is progress (and ends the search). Otherwise any row that fits is.
  TechniqueOptions now = current;
  now.micro_batch = micro < workload_.batch ? micro : 0;
  double now_pressure = std::numeric_limits<double>::infinity();
  for (const PlanRow& r : p.rows) {
    const TechniqueOptions& t = r.combination.techniques;
    if (t.checkpoint.str() == now.checkpoint.str() && t.precision == now.precision && t.micro_batch == now.micro_batch &&
        !t.offload_activations)
      now_pressure = pressure(r);
  }
  const PlanRow* best = nullptr;
  for (const PlanRow& r : p.rows)
    if (r.fits && pressure(r) < now_pressure && (!best || r.estimated_ms < best->estimated_ms)) best = &r;
  if (!best) return std::nullopt;
  return switched_plan(p, *best, current);
}

}  // namespace mg
