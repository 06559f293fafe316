// Placing a training command's model on its devices (see model_parallel_run.h).
#include "apps/model_parallel_run.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "models/gpt.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace mg {

std::optional<ModelParallelRun> place_model(const ModelParallelOptions& o, Module& model, const StepProbe& probe,
                                            const std::string& memory_limit, int64_t batch, int64_t micro_batch) {
  if (!o.active()) return std::nullopt;
  const bool tensor = o.split && o.split->kind == SplitSpec::Kind::tensor;
  auto* gpt = dynamic_cast<GPT*>(&model);
  MG_CHECK(!tensor || gpt, "--split tensor slices a GPT's attention heads and MLP over the devices (this is a ",
           model.type_name(), "; use stages:K or balanced)");
  if (tensor) check_tensor_parallel(*gpt, o.devices);  // before any budget is set or anything moves
  Placement placement;
  BalancedPlan plan;
  if (tensor) {
    // no placement: apply_tensor_parallel slices the blocks below
  } else if (o.split) {
    std::vector<int64_t> budgets = o.balance_budgets;
    if (budgets.empty()) {  // balanced against --memory-limit when it gives every device a budget
      const MemoryLimits limits = parse_memory_limits(memory_limit, o.devices);
      for (const Device& d : o.devices) budgets.push_back(limit_of(limits, d));
      if (std::find(budgets.begin(), budgets.end(), 0) != budgets.end()) budgets.clear();
    }
    placement = split_placement(*o.split, model, o.devices, &probe, &plan, budgets);
  } else {
    placement = *o.placement;
  }
  // Budgets: a device the model is not built on gets its budget before the modules move there,
  // so the move itself is held to it; the device it is built on once the others' modules left.
  const std::vector<Device> devices = tensor ? o.devices : placement.devices();
  const auto limits = parse_memory_limits(memory_limit, devices);
  const std::vector<Tensor> params = model.parameters();
  const Device home = params.empty() ? kCPU : params.front().device();  // where the model was built
  for (const auto& [device, bytes] : limits)
    if (device != home) set_memory_limit(device, size_t(bytes));
  auto place = [&] {
    try {
      return tensor ? apply_tensor_parallel(*gpt, o.devices) : apply_placement(model, placement);
    } catch (const OutOfMemoryError& e) {
      throw OutOfMemoryError(std::string(e.what()) + "\n  while placing the model: " + (tensor ? o.str() : placement.str()));
    }
  };
  ModelParallelRun run{.placement = place(), .devices = devices};
  // What the moved modules left cached on the home device goes back, budget or not, so the
  // steps' blocks are cut alike with and without --memory-limit (memgrad plan's split rows are
  // measured without one).
  empty_cache(home);
  run.notes.push_back("model parallel: " + o.str() + "; " + run.placement.str());
  if (o.split && o.split->kind == SplitSpec::Kind::balanced) {
    run.predicted = plan.predicted;
    std::string cut = plan.str();
    while (!cut.empty() && cut.back() == '\n') cut.pop_back();
    run.notes.push_back(cut);
  }
  for (const auto& [device, bytes] : limits) {
    if (device == home) set_memory_limit(device, size_t(bytes));
    const int64_t reserved = memory_stats(device).reserved.current;
    if (reserved > bytes)
      throw with_placement(OutOfMemoryError("out of memory on " + device.str() + ": the modules placed there take " +
                                            format_bytes(reserved) + ", over its budget of " + format_bytes(bytes)),
                           run.placement);
    run.notes.push_back("memory budget of " + device.str() + ": " + format_bytes(bytes) + " (holds " +
                        run.placement.modules_on(device) + ")");
  }
  if (o.pipeline) {
    run.stage_blocks = pipeline_stage_blocks(run.placement);
    MG_CHECK(run.stage_blocks.size() >= 2, "--pipeline: the placement puts every block on one device; a pipeline needs "
                                           "at least two stages");
    run.schedule = make_schedule(*o.pipeline, int64_t(run.stage_blocks.size()), num_micro_batches(batch, micro_batch));
    char line[160];
    std::snprintf(line, sizeof line, "pipeline %s: %zu stages x %lld micro-batches of %lld, bubble %.3f (theory %.3f)",
                  pipeline_name(*o.pipeline).c_str(), run.stage_blocks.size(), (long long)run.schedule->micro_batches,
                  (long long)micro_batch, run.schedule->bubble_fraction(),
                  PipelineSchedule::theoretical_bubble(run.schedule->stages, run.schedule->micro_batches));
    run.notes.push_back(line);
    if (o.print_schedule) {
      std::string s = run.schedule->str();
      while (!s.empty() && s.back() == '\n') s.pop_back();
      run.notes.push_back(s);
    }
  }
  return run;
}

}  // namespace mg
