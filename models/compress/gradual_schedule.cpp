// The cubic sparsity schedule (see gradual_schedule.h).
#include "models/compress/gradual_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mg {

void GradualSchedule::validate() const {
  MG_CHECK(initial >= 0.0 && initial <= final && final < 1.0, "gradual pruning: sparsities must satisfy 0 <= initial (",
           initial, ") <= final (", final, ") < 1");
  MG_CHECK(begin >= 0 && begin < end, "gradual pruning: the ramp must end after it begins (steps ", begin, " to ", end,
           ")\n  hint: give --finetune-steps of at least 2");
  MG_CHECK(every >= 1, "gradual pruning: the update interval must be >= 1 step, got ", every);
}

double GradualSchedule::sparsity_at(int64_t step) const {
  if (step <= begin) return initial;
  if (step >= end) return final;
  const int64_t t = begin + (step - begin) / every * every;  // the last update at or before `step`
  if (t == begin) return initial;  // exactly (s_f + (s_i - s_f) rounds below s_i)
  const double frac = 1.0 - double(t - begin) / double(end - begin);
  return final + (initial - final) * frac * frac * frac;
}

bool GradualSchedule::updates_at(int64_t step) const {
  return step >= begin && step <= end && ((step - begin) % every == 0 || step == end);
}

nlohmann::json GradualSchedule::to_json() const {
  return {{"kind", "gradual"}, {"initial", initial}, {"final", final}, {"begin", begin}, {"end", end}, {"every", every}};
}

GradualSchedule GradualSchedule::from_json(const nlohmann::json& j) {
  MG_CHECK(j.value("kind", "") == "gradual", "gradual pruning: unknown schedule kind '", j.value("kind", "?"), "'");
  GradualSchedule s{.initial = j.at("initial").get<double>(), .final = j.at("final").get<double>(),
                    .begin = j.at("begin").get<int64_t>(), .end = j.at("end").get<int64_t>(),
                    .every = j.at("every").get<int64_t>()};
  s.validate();
  return s;
}

GradualSchedule default_gradual_schedule(double amount, int64_t at, int64_t steps) {
  MG_CHECK(steps >= 2, "prune: --schedule gradual raises the sparsity during fine-tuning; give --finetune-steps >= 2, "
           "got ", steps);
  const int64_t ramp = std::max<int64_t>(1, (3 * steps) / 4);
  GradualSchedule s{.initial = 0.0, .final = amount, .begin = at, .end = at + ramp,
                    .every = std::max<int64_t>(1, ramp / 10)};
  s.validate();
  return s;
}

}  // namespace mg
