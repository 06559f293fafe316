// Model-parallel options of the training commands (see model_parallel_options.h).
#include "apps/model_parallel_options.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"

namespace mg {

std::vector<Device> ModelParallelOptions::model_devices() const {
  if (placement) return placement->devices();
  return devices;
}

void ModelParallelOptions::validate(const std::string& cmd, int64_t micro_batch, bool auto_fit, bool offload,
                                    bool planned) const {
  MG_CHECK(!(split && placement), cmd, ": --split and --placement both say where the modules go; give one");
  MG_CHECK(devices.empty() || split || planned, cmd, ": --devices needs --split (",
           "attention-mlp, stages:K, balanced or tensor) to say how the model is cut over them, or --plan to choose it");
  if (planned && !devices.empty())
    MG_CHECK(devices.size() >= 2, cmd, ": --plan with --devices needs at least two devices to split over");
  if (split) MG_CHECK(devices.size() >= 2, cmd, ": --split ", split->str(), " needs --devices with at least two devices");
  if (placement)
    MG_CHECK(placement->devices().size() >= 2, cmd, ": --placement puts every module on ",
             placement->devices().front().str(), "; use --device for a single device");
  for (const Device& d : model_devices()) {
    MG_CHECK(!d.is_meta(), cmd, ": ", d.str(), " holds no data; split the model over cpu:N or cuda:N devices");
    MG_CHECK(d != kHostData, cmd, ": ", d.str(), " is the pool of the datasets; use another cpu index");
  }
  if (pipeline) {
    MG_CHECK(active(), cmd, ": --pipeline needs a model split into stages (--split stages:K, --split balanced or a "
                            "--placement of whole blocks)");
    MG_CHECK(!(split && split->kind == SplitSpec::Kind::attention_mlp), cmd,
             ": --pipeline needs stages of whole blocks; --split attention-mlp splits every block in two");
    MG_CHECK(!(split && split->kind == SplitSpec::Kind::tensor), cmd,
             ": --pipeline needs stages of whole blocks; --split tensor slices every block over all devices");
    MG_CHECK(micro_batch > 0, cmd, ": --pipeline ", pipeline_name(*pipeline),
             " runs micro-batches through the stages; give --micro-batch M");
    MG_CHECK(!auto_fit, cmd, ": --pipeline does not combine with --auto-fit (the schedule is fixed before the step)");
    MG_CHECK(!offload, cmd, ": --pipeline does not combine with --offload-activations");
  }
  MG_CHECK(!print_schedule || pipeline, cmd, ": --print-schedule needs --pipeline");
}

nlohmann::json ModelParallelOptions::to_json() const {
  if (!active()) return nullptr;
  nlohmann::json j;
  std::vector<std::string> names;
  for (const Device& d : model_devices()) names.push_back(d.str());
  j["devices"] = names;
  if (split) j["split"] = split->str();
  if (placement) j["placement"] = placement->str();
  if (pipeline) j["pipeline"] = pipeline_name(*pipeline);
  return j;
}

ModelParallelOptions ModelParallelOptions::from_json(const nlohmann::json& j) {
  ModelParallelOptions o;
  if (j.is_null()) return o;
  MG_CHECK(j.is_object(), "model_parallel must be an object, got ", j.dump());
  if (j.contains("split")) {
    o.split = SplitSpec::parse(j.at("split").get<std::string>());
    for (const auto& d : j.at("devices")) o.devices.emplace_back(d.get<std::string>());
  }
  if (j.contains("placement")) o.placement = Placement::parse(j.at("placement").get<std::string>());
  if (j.contains("pipeline")) o.pipeline = parse_pipeline(j.at("pipeline").get<std::string>());
  return o;
}

std::string ModelParallelOptions::str() const {
  if (!active()) return "one device";
  std::string s = split ? split->str() + " over " : std::string("placement over ");
  const std::vector<Device> ds = model_devices();
  for (size_t i = 0; i < ds.size(); ++i) {
    if (i) s += ',';
    s += ds[i].str();
  }
  if (pipeline) s += ", " + pipeline_name(*pipeline) + " pipeline";
  return s;
}

MemoryLimits parse_memory_limits(const std::string& spec, const std::vector<Device>& devices) {
  MemoryLimits limits;
  if (spec.empty()) return limits;
  if (spec.find('=') == std::string::npos) {  // one budget for every device
    const int64_t bytes = int64_t(parse_bytes(spec));
    for (const Device& d : devices) limits.emplace_back(d, bytes);
    return limits;
  }
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    MG_CHECK(eq != std::string::npos, "--memory-limit: '", item, "' is not DEVICE=SIZE (e.g. cpu:0=200MiB)");
    const Device d(item.substr(0, eq));
    MG_CHECK(std::find(devices.begin(), devices.end(), d) != devices.end(), "--memory-limit: ", d.str(),
             " is not a device of this run");
    for (const auto& [seen, _] : limits) MG_CHECK(seen != d, "--memory-limit: ", d.str(), " is given twice");
    limits.emplace_back(d, int64_t(parse_bytes(item.substr(eq + 1))));
    pos = comma + 1;
  }
  return limits;
}

int64_t limit_of(const MemoryLimits& limits, const Device& device) {
  for (const auto& [d, bytes] : limits)
    if (d == device) return bytes;
  return 0;
}

std::string memory_limits_spec(const MemoryLimits& limits) {
  std::string spec;
  for (const auto& [d, bytes] : limits)
    if (bytes > 0) {
      if (!spec.empty()) spec += ',';
      spec += d.str() + '=' + std::to_string(bytes);
    }
  return spec;
}

void set_memory_limits(const std::string& spec, const std::vector<Device>& devices) {
  for (const auto& [device, bytes] : parse_memory_limits(spec, devices)) set_memory_limit(device, size_t(bytes));
}

}  // namespace mg
