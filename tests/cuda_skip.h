// The GPU test cases' guard: why they cannot run here ("" when they can: a CUDA device and
// MG_TEST_DEVICE=cuda, as scripts/gpu-check sets), and MG_REQUIRE_CUDA(), which skips a case
// with a visible warning.
#pragma once
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "core/cuda/backend.h"

namespace mg::test {

inline std::string cuda_skip_reason() {
  if (cuda::device_count() == 0) return "no CUDA device (" + cuda::device_count_error() + ")";
  const char* dev = std::getenv("MG_TEST_DEVICE");
  if (!dev || std::string(dev) != "cuda") return "MG_TEST_DEVICE is not 'cuda'";
  return "";
}

}  // namespace mg::test

#define MG_SKIP_UNLESS(reason_expr)          \
  do {                                       \
    const std::string why_ = (reason_expr);  \
    if (!why_.empty()) {                     \
      WARN("skipped: " << why_);             \
      return;                                \
    }                                        \
  } while (0)

#define MG_REQUIRE_CUDA() MG_SKIP_UNLESS(::mg::test::cuda_skip_reason())
