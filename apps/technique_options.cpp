// Typed technique options: validation, log text and their config.json form (see technique_options.h).
#include "apps/technique_options.h"

#include "core/error.h"

namespace mg {

void TechniqueOptions::validate(int64_t batch, const Device& train_device) const {
  MG_CHECK(micro_batch >= 0, "--micro-batch must be >= 0 (0: the whole batch), got ", micro_batch);
  MG_CHECK(micro_batch <= batch, "--micro-batch (", micro_batch, ") cannot exceed --batch (", batch, ")");
  if (offload_activations) {
    const Device& d = *offload_activations;
    MG_CHECK(!d.is_meta() && d != train_device, "--offload-activations ", d.str(),
             ": needs another device with data than the training device ", train_device.str(),
             "\n  hint: use cpu:1 when training on cpu:0, cpu:0 when training on cuda:0");
  }
}

TrainerOptions TechniqueOptions::trainer_options(double grad_clip) const {
  TrainerOptions t;
  t.micro_batch = micro_batch;
  t.auto_fit = auto_fit;
  t.precision = precision;
  t.grad_clip = grad_clip;
  t.offload_activations = offload_activations;
  return t;
}

std::string TechniqueOptions::str() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (checkpoint.enabled()) add("checkpoint=" + checkpoint.str());
  if (precision != Precision::fp32) add(precision_name(precision));
  if (micro_batch > 0) add("micro-batch=" + std::to_string(micro_batch));
  if (auto_fit) add("auto-fit");
  if (offload_activations) add("offload=" + offload_activations->str());
  return s.empty() ? "none" : s;
}

nlohmann::json TechniqueOptions::to_json() const {
  return {{"checkpoint", checkpoint.str()}, {"precision", precision_name(precision)}, {"micro_batch", micro_batch},
          {"offload_activations", offload_activations ? offload_activations->str() : std::string()}};
}

TechniqueOptions TechniqueOptions::with_process_settings(const TechniqueOptions& process) const {
  TechniqueOptions t = *this;
  t.auto_fit = process.auto_fit;
  t.profile = process.profile;
  return t;
}

TechniqueOptions TechniqueOptions::from_config(const nlohmann::json& config) const {
  TechniqueOptions t;
  t.auto_fit = auto_fit;
  t.profile = profile;
  if (!config.contains("techniques")) return t;
  try {
    const auto& j = config.at("techniques");
    t.checkpoint = CheckpointPolicy::parse(j.at("checkpoint").get<std::string>());
    t.precision = parse_precision(j.at("precision").get<std::string>());
    t.micro_batch = j.at("micro_batch").get<int64_t>();
    const std::string offload = j.at("offload_activations").get<std::string>();
    if (!offload.empty()) t.offload_activations = Device(offload);
  } catch (const nlohmann::json::exception& e) {
    MG_THROW("config.json: 'techniques' is malformed: ", e.what());
  } catch (const Error& e) {
    MG_THROW("config.json: 'techniques' holds a bad value: ", e.what());
  }
  return t;
}

}  // namespace mg
