// Learning-rate schedules (see lr_schedule.h): closed forms, no state.
#include "optim/lr_schedule.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace mg {

double constant_lr(double base_lr, int64_t step) {
  MG_CHECK(step >= 0, "constant_lr: step must be >= 0, got ", step);
  return base_lr;
}

double step_lr(double base_lr, int64_t step, int64_t step_size, double gamma) {
  MG_CHECK(step >= 0 && step_size > 0, "step_lr: step ", step, " must be >= 0 and step_size ", step_size, " > 0");
  return base_lr * std::pow(gamma, double(step / step_size));
}

double cosine_lr(double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps, double min_lr) {
  MG_CHECK(step >= 0 && warmup_steps >= 0 && total_steps > warmup_steps, "cosine_lr: need step >= 0 and 0 <= ",
           "warmup_steps < total_steps, got step ", step, ", warmup ", warmup_steps, ", total ", total_steps);
  if (step < warmup_steps) return base_lr * double(step + 1) / double(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress = double(step - warmup_steps) / double(total_steps - warmup_steps);  // [0, 1)
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));                             // 1 -> 0
  return min_lr + coeff * (base_lr - min_lr);
}

LrSchedule LrSchedule::constant(double base_lr) {
  LrSchedule s;
  s.base_lr = base_lr;
  return s;
}

LrSchedule LrSchedule::step_decay(double base_lr, int64_t step_size, double gamma) {
  LrSchedule s;
  s.kind = Kind::step;
  s.base_lr = base_lr;
  s.step_size = step_size;
  s.gamma = gamma;
  return s;
}

LrSchedule LrSchedule::cosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr) {
  LrSchedule s;
  s.kind = Kind::cosine;
  s.base_lr = base_lr;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  s.min_lr = min_lr;
  return s;
}

double LrSchedule::operator()(int64_t step) const {
  switch (kind) {
    case Kind::constant: return constant_lr(base_lr, step);
    case Kind::step: return step_lr(base_lr, step, step_size, gamma);
    case Kind::cosine: return cosine_lr(base_lr, step, warmup_steps, total_steps, min_lr);
  }
  return base_lr;
}

std::string LrSchedule::str() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::constant: os << "constant(lr=" << base_lr << ")"; break;
    case Kind::step: os << "step(lr=" << base_lr << ", every=" << step_size << ", gamma=" << gamma << ")"; break;
    case Kind::cosine:
      os << "cosine(lr=" << base_lr << ", warmup=" << warmup_steps << ", total=" << total_steps << ", min=" << min_lr
         << ")";
      break;
  }
  return os.str();
}

}  // namespace mg
