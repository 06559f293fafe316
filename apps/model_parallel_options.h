// How a training command spreads its model over several devices (parallel/): --devices, --split or
// --placement, --pipeline and --print-schedule, parsed at the command-line edge into typed values
// (apps/model_parallel_flags.h), checked before any work starts, and recorded in config.json so a
// resumed run places the model the same way.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "parallel/placement.h"
#include "parallel/schedule.h"
#include "parallel/split.h"

namespace mg {

struct ModelParallelOptions {
  std::vector<Device> devices{};           // --devices cpu:0,cpu:1 (with --split)
  std::optional<SplitSpec> split{};        // --split attention-mlp | stages:K | balanced
  std::optional<Placement> placement{};    // --placement 'wte,h.0-5=cpu:0;...' (instead of --split)
  std::optional<PipelineKind> pipeline{};  // --pipeline gpipe | 1f1b (needs --micro-batch)
  bool print_schedule = false;             // print the pipeline's schedule before the first step
  // --split balanced: the budgets its peaks are balanced against, one per device (empty: those of
  // --memory-limit when it gives every device one, else the devices count as equal). memgrad plan
  // sets them so that a row measured without its budgets is cut as the run under them is.
  std::vector<int64_t> balance_budgets{};

  // Whether the model is split at all.
  bool active() const { return split.has_value() || placement.has_value(); }
  // The devices the model lives on: --devices, or those the placement names.
  std::vector<Device> model_devices() const;
  // Errors name the flag: --split without --devices (or with one device), --split and
  // --placement together, --devices without either (unless `planned`: --plan chooses the split
  // over them), --pipeline without a split into stages or without --micro-batch,
  // --print-schedule without --pipeline, and techniques the pipeline cannot combine with
  // (auto-fit, activation offload).
  void validate(const std::string& cmd, int64_t micro_batch, bool auto_fit, bool offload, bool planned = false) const;
  // {"devices": [...], "split": "balanced" | "placement": "...", "pipeline": "1f1b"}; null when
  // the model is not split.
  nlohmann::json to_json() const;
  static ModelParallelOptions from_json(const nlohmann::json& j);
  // "balanced over cpu:0,cpu:1, 1f1b pipeline" for log lines.
  std::string str() const;
};

// A budget in bytes per device (a device not listed has none).
using MemoryLimits = std::vector<std::pair<Device, int64_t>>;

// "cpu:0=200MiB,cpu:1=300MiB" -> a budget per device; "512MiB" -> that budget on every device of
// `devices`; "" -> none. Errors name --memory-limit: a device the run does not use, a device given
// twice, a bad size.
MemoryLimits parse_memory_limits(const std::string& spec, const std::vector<Device>& devices);
// The budget `limits` gives `device`; 0 when it gives none.
int64_t limit_of(const MemoryLimits& limits, const Device& device);
// The spec parse_memory_limits reads back: "cpu:0=209715200,cpu:1=314572800" (bytes; a budget of 0,
// none, is left out).
std::string memory_limits_spec(const MemoryLimits& limits);
// Sets the budgets parse_memory_limits reads from `spec`.
void set_memory_limits(const std::string& spec, const std::vector<Device>& devices);

}  // namespace mg
