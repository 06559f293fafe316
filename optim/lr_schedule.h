// Learning-rate schedules as pure functions of the step (0-based), so a resumed run computes the
// same rate from its step count with no schedule state to save. Call optimizer.set_lr(s(step))
// before each optimizer.step().
#pragma once
#include <cstdint>
#include <string>

namespace mg {

// base_lr at every step.
double constant_lr(double base_lr, int64_t step);
// base_lr * gamma^(step / step_size) (integer division): PyTorch's StepLR.
double step_lr(double base_lr, int64_t step, int64_t step_size, double gamma);
// Linear warmup from base_lr / warmup_steps (step 0) to base_lr (step warmup_steps - 1), then a
// cosine from base_lr (step warmup_steps) down to min_lr (step total_steps), min_lr after that.
double cosine_lr(double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps, double min_lr);

// One of the above as a value (what a command line builds from its flags).
struct LrSchedule {
  enum class Kind { constant, step, cosine };
  Kind kind = Kind::constant;
  double base_lr = 1e-3;
  int64_t step_size = 1;    // step
  double gamma = 1.0;       // step
  int64_t warmup_steps = 0; // cosine
  int64_t total_steps = 1;  // cosine
  double min_lr = 0.0;      // cosine

  static LrSchedule constant(double base_lr);
  static LrSchedule step_decay(double base_lr, int64_t step_size, double gamma);
  static LrSchedule cosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr);
  double operator()(int64_t step) const;
  std::string str() const;  // "cosine(lr=0.0003, warmup=100, total=5000, min=3e-05)"
};

}  // namespace mg
