// Step meters of the training loop (see step_meters.h).
#include "apps/step_meters.h"

#include <algorithm>
#include <optional>

#include "core/memory_profiler.h"

namespace mg {

void PeakMeter::begin_step() { reset_peak_stats(device_); }

int64_t PeakMeter::end_step() {
  const MemoryStats st = memory_stats(device_);
  const int64_t peak = st.allocated.peak;
  run_peak_ = std::max(run_peak_, peak);
  if (++steps_ == 2) steady_ = {};  // the first step (warm-up) counts only while it is alone
  if (peak >= steady_.total) steady_.at_peak = st.by_category_at_peak;
  steady_.total = std::max(steady_.total, peak);
  steady_.reserved = std::max(steady_.reserved, st.reserved.peak);
  for (MemoryCategory c : kAllMemoryCategories)
    steady_.category[size_t(c)] = std::max(steady_.category[size_t(c)], st.category(c).peak);
  return peak;
}

int64_t PeakMeter::allocated() const { return memory_stats(device_).allocated.current; }
int64_t PeakMeter::limit() const { return int64_t(memory_limit(device_)); }

double StepTimes::stop() {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  times_.push_back(s);
  return s;
}

double StepTimes::median() const {
  if (times_.empty()) return 0.0;
  std::vector<double> t(times_.begin() + (times_.size() > 2 ? 1 : 0), times_.end());
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

double StepTimes::total() const {
  double s = 0.0;
  for (double t : times_) s += t;
  return s;
}

StepMemory StepMemory::of(const PeakMeter& m) {
  StepMemory s{m.steady_peak(), m.steady_reserved_peak(), {}, {}};
  for (MemoryCategory c : kAllMemoryCategories) {
    s.category[size_t(c)] = m.steady_category_peak(c);
    s.at_peak[size_t(c)] = m.steady_category_at_peak(c);
  }
  return s;
}

struct StepProfiler::Impl {
  std::optional<MemoryProfiler> profiler;
  int64_t step = -1;
};

StepProfiler::StepProfiler(const TechniqueOptions& t, const std::vector<Device>& train_devices, int64_t first_step,
                           int64_t last_step)
    : impl_(std::make_unique<Impl>()) {
  if (!t.profile || first_step >= last_step) return;
  std::vector<Device> devices = train_devices;
  if (t.offload_activations && std::find(devices.begin(), devices.end(), *t.offload_activations) == devices.end())
    devices.push_back(*t.offload_activations);
  impl_->profiler.emplace(devices);
  impl_->step = last_step - first_step > 1 ? first_step + 1 : first_step;
}

StepProfiler::~StepProfiler() = default;

bool StepProfiler::profiles(int64_t step) const { return impl_->profiler && step == impl_->step; }

void StepProfiler::name_tensors(const NamedTensors& named) {
  if (impl_->profiler) impl_->profiler->name_tensors(named);
}

void StepProfiler::before_step(int64_t step) {
  if (impl_->profiler && step == impl_->step) impl_->profiler->start();
}

std::string StepProfiler::after_step(int64_t step, const std::string& run_dir) {
  if (!impl_->profiler || step != impl_->step || !impl_->profiler->active()) return "";
  impl_->profiler->stop();
  impl_->profiler->write(run_dir);
  const MemoryProfileSummary s = impl_->profiler->summary();
  std::string peaks;
  for (const DeviceMemoryProfile& d : s.devices)
    peaks += (peaks.empty() ? "" : ", ") + std::string(s.devices.size() > 1 ? d.device.str() + " " : "") + "peak " +
             format_bytes(d.peak_bytes) + " in " + std::string(step_phase_name(d.peak_phase));
  return "memory profile of step " + std::to_string(step + 1) + ": " + peaks + " -> " + run_dir +
         "/memory.html (memgrad report " + run_dir + ")";
}

}  // namespace mg
