// What `gpt train` and `vision train` share: opening the device with its budget, creating or
// reopening a run directory with clear errors, the generator dropout draws from, the per-step
// peak memory meter and the step-time statistics the commands report.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/run_dir.h"
#include "autograd/checkpoint.h"
#include "optim/trainer.h"
#include "core/device.h"
#include "core/rng.h"

namespace mg {

// The device, with `memory_limit` ("512MiB"; "" = none) set as its budget.
Device open_device(const std::string& device, const std::string& memory_limit);

// The run directory of a new run: `out`, or runs/<prefix>-<date>-<time> when empty. An existing
// folder that already holds a checkpoint is an error that points to --resume (`cmd` names the
// command in messages, e.g. "gpt train"). The folder is not created here: write_config does, so
// a run with a bad flag leaves nothing behind.
RunDir new_run_dir(const std::string& out, const std::string& prefix, const std::string& cmd);
// The run directory to continue: it must exist, hold config.json and a complete checkpoint.
RunDir resume_run_dir(const std::string& path, const std::string& cmd);
// The run directory to read from (sample, eval): exists, has config.json and a checkpoint.
RunDir existing_run_dir(const std::string& path, const std::string& cmd);

// The generator every Dropout layer draws from (nn layers built without one use the default
// generator). Its state goes into each checkpoint under the role "dropout", so a resumed run
// draws the same masks as an uninterrupted one.
Generator& dropout_generator();

// The memory techniques a training command switches on (`--checkpoint`, `--precision`,
// `--micro-batch`, `--auto-fit`, `--offload-activations`): recorded in config.json, so a resumed
// run uses the same ones (auto-fit and the budget are settings of the process, not of the run).
struct TechniqueOptions {
  std::string checkpoint = "none";   // CheckpointPolicy::parse
  std::string precision = "fp32";    // parse_precision
  int64_t micro_batch = 0;           // 0: the whole batch
  bool auto_fit = false;
  std::string offload_activations{};  // "" or a device, e.g. cpu:1
  // --profile: record the second step of this process (the first when only one runs) and write
  // memory.json and memory.html into the run directory. Not part of the run's settings.
  bool profile = false;
  // Throws naming the flag when a value is bad; `batch` bounds the micro-batch.
  void validate(int64_t batch, const Device& train_device) const;
  CheckpointPolicy checkpoint_policy() const { return CheckpointPolicy::parse(checkpoint); }
  TrainerOptions trainer_options(double grad_clip) const;
  // "ckpt=blocks bf16 micro=2 ..." for log lines; "none" when nothing is on.
  std::string str() const;
  nlohmann::json to_json() const;
  // The run's techniques from config.json (missing: all off); auto_fit and profile are kept from `*this`.
  TechniqueOptions from_config(const nlohmann::json& config) const;
};

// --profile in a training loop: watches the training device (and the offload target), starts
// before the chosen step, and writes the profile into the run directory after it.
class StepProfiler {
 public:
  StepProfiler(const TechniqueOptions& t, const Device& device, int64_t first_step, int64_t last_step);
  ~StepProfiler();
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

 private:
  struct Peaks {
    int64_t total = 0, reserved = 0;
    std::array<int64_t, kNumMemoryCategories> category{};
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
  static StepMemory of(const PeakMeter& m);
};

// Wall-clock seconds of each training step, for medians (DESIGN.md: time figures are medians
// of steps after warm-up).
class StepTimes {
 public:
  void start() { t0_ = std::chrono::steady_clock::now(); }
  double stop();  // seconds since start(), recorded
  // Median of the recorded steps, leaving out the first (warm-up) when there are more than two.
  double median() const;
  double total() const;
  size_t count() const { return times_.size(); }

 private:
  std::chrono::steady_clock::time_point t0_;
  std::vector<double> times_;
};

// Ctrl-C while training: the first SIGINT only raises a flag, so the loop can finish its step,
// write a checkpoint and return (a second one ends the process as usual). The previous handler
// comes back when the guard goes out of scope.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  bool raised() const;

 private:
  void (*previous_)(int);
};

// A flag that cannot change on --resume, named in the error when it was given anyway.
void reject_on_resume(bool given, const std::string& flag, const std::string& cmd);

}  // namespace mg
