// Fuzz target: safetensors files (core/safetensors.cpp): header validation, checksums, loading
// onto cpu and onto meta (header only).
#include "core/error.h"
#include "core/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mg::fuzz::write_input("f.safetensors", data, size);
  try {
    mg::load_safetensors_metadata(path);
    mg::load_safetensors(path, mg::kMeta);
    mg::load_safetensors(path, mg::kCPU);
  } catch (const mg::Error&) {
  }
  return 0;
}
