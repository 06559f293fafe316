// What the training loop measures of each step: the allocator's peak per step and over the run
// (per category, after warm-up: what `memgrad bench` reports), wall-clock step times for medians,
// and --profile's recording of one step into memory.json / memory.html.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/technique_options.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/named_tensors.h"

namespace mg {

// --profile in a training loop: watches the training devices (and the offload target), starts
// before the chosen step, and writes the profile into the run directory after it.
class StepProfiler {
 public:
  StepProfiler(const TechniqueOptions& t, const std::vector<Device>& devices, int64_t first_step, int64_t last_step);
  ~StepProfiler();
  // Whether `step` is the one recorded.
  bool profiles(int64_t step) const;
  // Names the tensors that exist before the recorded step (parameters, buffers, optimizer state).
  void name_tensors(const NamedTensors& named);
  void before_step(int64_t step);
  // After the step: when it was the profiled one, writes memory.json / memory.html and returns a
  // line for the log ("" otherwise).
  std::string after_step(int64_t step, const std::string& run_dir);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Peak allocated bytes per step and over the run, from the allocator's statistics; per category
// and reserved too, over the steps after the first (what `memgrad bench` reports).
class PeakMeter {
 public:
  PeakMeter(Device device, int64_t run_peak = 0) : device_(device), run_peak_(run_peak) {}
  void begin_step();      // resets the device's peak counter
  int64_t end_step();     // the step's peak; updates the run's
  int64_t run_peak() const { return run_peak_; }
  int64_t allocated() const;
  int64_t limit() const;
  // Maxima over the steps after the first one this meter saw (all steps when only one ran).
  int64_t steady_peak() const { return steady_.total; }
  int64_t steady_reserved_peak() const { return steady_.reserved; }
  int64_t steady_category_peak(MemoryCategory c) const { return steady_.category[size_t(c)]; }
  // Each category's bytes at the moment of steady_peak() (they sum to it).
  int64_t steady_category_at_peak(MemoryCategory c) const { return steady_.at_peak[size_t(c)]; }

 private:
  struct Peaks {
    int64_t total = 0, reserved = 0;
    std::array<int64_t, kNumMemoryCategories> category{};
    std::array<int64_t, kNumMemoryCategories> at_peak{};  // the make-up of `total`
  };
  Device device_;
  int64_t run_peak_;
  int64_t steps_ = 0;
  Peaks steady_;
};

// What `memgrad bench` tabulates of a run: PeakMeter's steady-state maxima.
struct StepMemory {
  int64_t peak = 0;      // allocated, all categories together
  int64_t reserved = 0;  // held from the backend
  std::array<int64_t, kNumMemoryCategories> category{};  // each category's own maximum
  std::array<int64_t, kNumMemoryCategories> at_peak{};   // each category at the moment of `peak` (sums to it)
  static StepMemory of(const PeakMeter& m);
};

// Wall-clock seconds of each training step, for medians (DESIGN.md: time figures are medians
// of steps after warm-up).
class StepTimes {
 public:
  void start() { t0_ = std::chrono::steady_clock::now(); }
  double stop();  // seconds since start(), recorded
  void add(double seconds) { times_.push_back(seconds); }  // a duration measured elsewhere
  // Median of the recorded steps, leaving out the first (warm-up) when there are more than two.
  double median() const;
  double total() const;
  size_t count() const { return times_.size(); }

 private:
  std::chrono::steady_clock::time_point t0_;
  std::vector<double> times_;
};

}  // namespace mg
