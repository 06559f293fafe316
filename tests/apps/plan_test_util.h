// Helpers for the memgrad plan tests: one calibration cache for every test process (in the temp
// folder, never the user's home) and the tiny GPT workload they plan.
#pragma once
#include <cstdlib>
#include <filesystem>

#include "apps/plan_step.h"

namespace mg::test {

inline void use_test_cache() {
  const auto dir = std::filesystem::temp_directory_path() / "memgrad-test-cache";
  ::setenv("MG_CACHE_DIR", dir.c_str(), 1);
}

inline PlanWorkload tiny_gpt() {
  PlanWorkload w;
  w.name = "tiny-gpt";
  w.gpt = GPTConfig{.vocab_size = 64, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.1};
  w.batch = 4;
  w.grad_clip = 1.0;
  w.prefetch = 2;
  return w;
}

}  // namespace mg::test
