// The quantized model file: a safetensors file whose tensors are the quantized model's state dict
// (per layer: weight_int8 i8, weight_scale f32 (Cout), bias f32, and for full-int8 layers
// input_scale f32 (1), input_zero_point i32 (1)) and whose metadata "memgrad.quantized" is JSON
// describing it: format version, model family and config, scheme, observer, calibration batches
// and every quantized layer with its type. Loading rebuilds the model from that JSON, applies the
// same structural passes, checks the layer list, loads strictly and validates every scale.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "models/nn/module.h"

namespace mg {

inline constexpr const char* kQuantMetadataKey = "memgrad.quantized";

struct QuantizedModelInfo {
  std::string model;      // "gpt" or "mobilenetv2"
  nlohmann::json config;  // GPTConfig / MobileNetV2Config JSON
  std::string scheme;     // "int8_weight_only", "int8_outlier" (GPT), "int8_ptq" or "int8_qat" (MobileNetV2)
  nlohmann::json calibration = nlohmann::json::object();  // observer, batches (PTQ)
  std::map<std::string, std::string> layers;  // dotted name -> layer type (Int8Conv2d, ...)
};

// The quantized layers of a model (every module whose type starts with "Int8").
std::map<std::string, std::string> quantized_layers(Module& m);

// Writes m's state dict and `info` (its layers filled from m) atomically.
void save_quantized(const std::string& path, Module& m, QuantizedModelInfo info);
// The metadata only; throws naming the file when it is not a memgrad quantized model.
QuantizedModelInfo read_quantized_info(const std::string& path);
// Whether `path` is a safetensors file with quantized metadata (no throw for other files).
bool is_quantized_file(const std::string& path);

struct LoadedQuantizedModel {
  std::shared_ptr<Module> model;  // a GPT or a MobileNetV2, in eval mode
  QuantizedModelInfo info;
};
// Builds, structures and loads; every problem is an error naming the file and the key.
LoadedQuantizedModel load_quantized(const std::string& path, Device device = kCPU);

}  // namespace mg
