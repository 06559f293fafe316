// One training step of a workload (a GPT or MobileNetV2 configuration, a batch, the techniques)
// run on any device through the Trainer the training commands use, measured as `memgrad bench`
// measures a run: the allocator's peak per category over the step after a warm-up step. On meta
// this is the planner's estimate (shapes and bytes only, milliseconds); on cpu:N the same code is
// the measurement it must equal byte for byte (tests/apps/test_plan_step.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/data_parallel_options.h"
#include "apps/model_parallel_options.h"
#include "apps/step_meters.h"
#include "apps/technique_options.h"
#include "core/flop_counter.h"
#include "apps/training_loop.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"

namespace mg {

struct PlanWorkload {
  std::string name = "custom";                   // the named configuration, for tables
  std::optional<GPTConfig> gpt{};                // exactly one of gpt / mobilenet
  std::optional<MobileNetV2Config> mobilenet{};
  int64_t batch = 0;                             // examples per step (GPT: sequences of gpt->context tokens)
  OptimizerKind optimizer = OptimizerKind::adamw;
  double momentum = 0.9;                         // SGD's (0: no state)
  double grad_clip = 0.0;                        // the command's default (GPT 1.0, vision 0)
  // Batches the data loader holds beyond the one in use (its prefetch queue): their input bytes
  // are live for the whole step.
  int64_t prefetch = 0;

  // "gpt-mini", "gpt-small", "gpt2-124m", "mobilenetv2-32", "mobilenetv2-224" with batch 0 for the
  // workload's (DESIGN.md: 8 for GPT, 64 for mobilenetv2-32, 32 for mobilenetv2-224) and the
  // training commands' defaults for optimizer, clipping and prefetch; an unknown name is an error
  // listing the known ones.
  static PlanWorkload named(const std::string& model, int64_t batch = 0);
  bool is_gpt() const { return gpt.has_value(); }
  int64_t num_parameters() const;                 // from the configuration, without building it
  int64_t items_per_step() const;                 // tokens or images
};

// What one measured step did: its memory (steady state over the steps after the first), the
// FLOPs its ops reported (meta only: a real step is timed without the counter) and the bytes it
// allocated (the last step's, on the device and the offload target), and the median wall-clock
// time of the steps after the first.
struct StepMeasurement {
  StepMemory memory{};  // a split step: the device whose peak is highest
  // Each device's memory in placement order, with what lives there ("wte,wpe,h.0-3"; one device: "all").
  struct DeviceMemory {
    Device device;
    StepMemory memory{};
    std::string modules{};
  };
  std::vector<DeviceMemory> devices{};
  FlopCounts flops{};  // zero unless the step ran on meta
  int64_t allocated_bytes = 0;
  double ms_per_step = 0.0;  // meaningless on meta (no arithmetic)
  std::vector<double> timed_ms{};  // each step's wall-clock ms after the first (warm-up) one
  // The same steps' CPU time of the whole process (all its threads): unlike wall-clock time, not
  // inflated while other processes hold the cores (Note [CPU time] in plan_step.cpp).
  std::vector<double> timed_cpu_ms{};
  // Data parallel: the bytes this rank handed to each kind of collective in the last step.
  ProcessGroup::Traffic traffic{};
};

// measure_step's `steps` for "until the peak is steady" (Note [Steady state] in plan_step.cpp).
inline constexpr int kUntilSteady = 0;
inline constexpr int kMaxSteadySteps = 8;

// Runs `steps` (>= 2, or kUntilSteady) Trainer steps of `w` under `t` on `device` in a fresh pool (the cache
// emptied, peaks reset). The offload target of `t` becomes meta:(device.index + 1) when `device`
// is meta. Each device `memory_limits` names has that budget during the steps (an allocation past
// it throws OutOfMemoryError, as in a run with --memory-limit); the previous limits are put back.
// Leaves the default and dropout generators where they were.
// With `parallel` active the model is built on `device` and then placed over parallel's devices
// as the training commands place it (place_model: attention-mlp, stages:K, balanced, tensor),
// every device measured, each under its budget in `memory_limits`. Not pipelined splits
// (their stages run on worker threads) and not with activation offload.
// With `data_parallel` enabled the step is one rank's of its group (a real one under mpirun, or
// ProcessGroup::simulated on meta): the model wrapped in DDP as the training commands wrap it
// (--zero, --bucket-mb), the rank's rows w.batch / N of the global batch w.batch.
StepMeasurement measure_step(const PlanWorkload& w, const TechniqueOptions& t, const Device& device,
                             int steps = kUntilSteady,
                             const MemoryLimits& memory_limits = {}, const ModelParallelOptions& parallel = {},
                             const DataParallelOptions& data_parallel = {});

// The update alone of `w` under `precision` on `device`: the median ms of `reps` (after a warm-up)
// optimizer steps with gradient clipping as the Trainer does them, over gradients of zeros (the
// optimizer's work does not depend on the values). What a step costs beyond its micro-steps.
// cpu_time: the process's CPU time instead of wall-clock time.
double measure_update_ms(const PlanWorkload& w, Precision precision, const Device& device, bool cpu_time,
                         int reps = 5);

}  // namespace mg
