// Gradual magnitude pruning (Zhu & Gupta 2017, "To prune, or not to prune"): instead of removing
// a fraction of the weights at once, the sparsity rises during fine-tuning along a cubic,
//   s(t) = s_f + (s_i - s_f) * (1 - (t - t0) / (t1 - t0))^3   for t0 <= t <= t1,
// updated every `every` steps (between updates the last value holds) and s_f after t1. The curve
// prunes fast while many weights are redundant and slowly near the end, so the network has time
// to recover from each step. MagnitudeMask::prune_to applies a value to the masks.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

namespace mg {

struct GradualSchedule {
  double initial = 0.0;   // s_i, at step `begin`
  double final = 0.0;     // s_f, from step `end` on
  int64_t begin = 0;      // t0: the first step of the ramp
  int64_t end = 0;        // t1 > t0
  int64_t every = 1;      // the sparsity changes only at begin + k * every (and at end)

  // Checks 0 <= initial <= final < 1, begin < end, every >= 1; throws naming the bad value.
  void validate() const;
  // The target sparsity after `step` optimizer steps (initial before begin, final from end on).
  double sparsity_at(int64_t step) const;
  // True when the sparsity changes at `step` (an update of the masks is due).
  bool updates_at(int64_t step) const;

  nlohmann::json to_json() const;
  static GradualSchedule from_json(const nlohmann::json& j);
};

// The schedule `memgrad prune --schedule gradual` uses for a fine-tune of `steps` steps from step
// `at` to sparsity `amount`: the ramp covers the first three quarters of the steps (the last
// quarter recovers at the final sparsity), updated about 10 times.
GradualSchedule default_gradual_schedule(double amount, int64_t at, int64_t steps);

}  // namespace mg
