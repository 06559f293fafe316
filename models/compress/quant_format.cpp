// Saving and strictly loading quantized models. The rebuilt model gets its structure from the
// same passes that quantized it (fold_batch_norms + convert_ptq_structure, or
// quantize_gpt_weight_only), so the file's layer list must match that structure exactly.
#include "models/compress/quant_format.h"

#include <cmath>

#include "core/error.h"
#include "core/safetensors.h"
#include "models/compress/int8_outlier_linear.h"
#include "models/compress/quant_convert.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"

namespace mg {
namespace {

constexpr int kFormatVersion = 1;

void check_scales(const std::string& path, const std::string& key, const Tensor& t) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    MG_CHECK(std::isfinite(p[i]) && p[i] > 0, "'", path, "': ", key, "[", i, "] = ", p[i],
             " is not a positive finite scale (corrupt quantized file)");
}

void check_zero_points(const std::string& path, const std::string& key, const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    MG_CHECK(p[i] >= 0 && p[i] <= 255, "'", path, "': ", key, "[", i, "] = ", p[i],
             " is not a u8 zero point in [0, 255] (corrupt quantized file)");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::map<std::string, std::string> quantized_layers(Module& m) {
  std::map<std::string, std::string> out;
  for (auto& [name, mod] : m.named_modules())
    if (mod->type_name().rfind("Int8", 0) == 0) out[name] = mod->type_name();
  return out;
}

void save_quantized(const std::string& path, Module& m, QuantizedModelInfo info) {
  info.layers = quantized_layers(m);
  MG_CHECK(!info.layers.empty(), "save_quantized: the model has no quantized layer");
  nlohmann::json j = {{"version", kFormatVersion}, {"model", info.model},       {"config", info.config},
                      {"scheme", info.scheme},     {"calibration", info.calibration}, {"layers", info.layers}};
  save_safetensors(path, m.state_dict(), {{"format", "pt"}, {kQuantMetadataKey, j.dump()}});
}

QuantizedModelInfo read_quantized_info(const std::string& path) {
  const auto meta = load_safetensors_metadata(path);
  auto it = meta.find(kQuantMetadataKey);
  MG_CHECK(it != meta.end(), "'", path, "' is not a memgrad quantized model (no '", kQuantMetadataKey,
           "' metadata)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const std::exception& e) {
    MG_THROW("'", path, "': the '", kQuantMetadataKey, "' metadata is not valid JSON: ", e.what());
  }
  QuantizedModelInfo info;
  try {
    MG_CHECK(j.at("version").get<int>() == kFormatVersion, "format version ", j.at("version").dump(),
             " is not supported (this memgrad reads version ", kFormatVersion, ")");
    info.model = j.at("model").get<std::string>();
    info.config = j.at("config");
    info.scheme = j.at("scheme").get<std::string>();
    info.calibration = j.value("calibration", nlohmann::json::object());
    info.layers = j.at("layers").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    MG_THROW("'", path, "': malformed '", kQuantMetadataKey, "' metadata: ", e.what());
  }
  MG_CHECK(info.model == "gpt" || info.model == "mobilenetv2", "'", path, "': unknown model family '", info.model,
           "' (known: gpt, mobilenetv2)");
  return info;
}

bool is_quantized_file(const std::string& path) {
  try {
    return load_safetensors_metadata(path).count(kQuantMetadataKey) > 0;
  } catch (const Error&) {
    return false;
  }
}

LoadedQuantizedModel load_quantized(const std::string& path, Device device) {
  LoadedQuantizedModel out{nullptr, read_quantized_info(path)};
  const QuantizedModelInfo& info = out.info;
  if (info.model == "gpt") {
    MG_CHECK(info.scheme == "int8_weight_only" || info.scheme == "int8_outlier", "'", path, "': scheme '", info.scheme,
             "' is not supported for gpt (known: int8_weight_only, int8_outlier)");
    auto gpt = std::make_shared<GPT>(GPTConfig::from_json(info.config), InitOptions{.device = device});
    if (info.scheme == "int8_outlier") quantize_gpt_int8_outlier(*gpt);  // the threshold is loaded with the weights
    else quantize_gpt_weight_only(*gpt);
    out.model = gpt;
  } else {
    // QAT converts to the same layers as PTQ (models/compress/qat.h)
    MG_CHECK(info.scheme == "int8_ptq" || info.scheme == "int8_qat", "'", path, "': scheme '", info.scheme,
             "' is not supported for mobilenetv2 (known: int8_ptq, int8_qat)");
    auto net = std::make_shared<MobileNetV2>(MobileNetV2Config::from_json(info.config), InitOptions{.device = device});
    net->eval();
    fold_batch_norms(*net);
    convert_ptq_structure(*net);
    out.model = net;
  }
  const auto expected = quantized_layers(*out.model);
  for (const auto& [name, type] : expected) {
    auto it = info.layers.find(name);
    MG_CHECK(it != info.layers.end(), "'", path, "': the metadata lists no quantized layer '", name, "' (", type, ")");
    MG_CHECK(it->second == type, "'", path, "': layer '", name, "' is a ", it->second, " in the file, a ", type,
             " in the model");
  }
  MG_CHECK(info.layers.size() == expected.size(), "'", path, "': the metadata lists ", info.layers.size(),
           " quantized layers, the model has ", expected.size());
  const auto tensors = load_safetensors(path, device);
  try {
    out.model->load_state_dict(tensors, /*strict=*/true);
  } catch (const Error& e) {
    MG_THROW("'", path, "': ", e.what());
  }
  for (const auto& [key, t] : tensors) {
    const bool scale = ends_with(key, "weight_scale") || ends_with(key, "input_scale");
    const bool zero = ends_with(key, "input_zero_point");
    if (!scale && !zero) continue;
    const Tensor host = t.device().is_cpu() ? t : to(t, kCPU);  // checked on the host
    if (scale) check_scales(path, key, host);
    else check_zero_points(path, key, host);
  }
  out.model->eval();
  return out;
}

}  // namespace mg
