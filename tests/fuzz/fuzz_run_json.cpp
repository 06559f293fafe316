// Fuzz target: a run directory's JSON files: config.json (the model configurations and the
// technique options read from it) and checkpoint/state.json (its checksum, then the training
// state), through the same RunDir calls the commands use. The input's first byte picks the file.
#include <filesystem>

#include "apps/run_dir.h"
#include "apps/technique_options.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string dir = (mg::fuzz::work_dir() / "run").string();
  mg::RunDir run(dir);
  try {
    if (data[0] & 1) {
      mg::fuzz::write_input("run/checkpoint/model.safetensors", nullptr, 0);
      mg::fuzz::write_input("run/checkpoint/optimizer.safetensors", nullptr, 0);
      mg::fuzz::write_input("run/checkpoint/state.json", data + 1, size - 1);
      run.read_checkpoint_state();
    } else {
      mg::fuzz::write_input("run/config.json", data + 1, size - 1);
      const nlohmann::json config = run.read_config();
      mg::TechniqueOptions{}.from_config(config);
      if (config.is_object() && config.contains("model")) {
        if (config.value("command", "") == "vision train") mg::MobileNetV2Config::from_json(config["model"]);
        else mg::GPTConfig::from_json(config["model"]);
      }
    }
  } catch (const mg::Error&) {
  }
  return 0;
}
