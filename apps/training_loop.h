// The training loop that `gpt train` and `vision train` share. A command builds its data, its
// model and its run directory, then hands the loop what is specific to it (a TrainingTask: the
// micro-batch loss, when and how to evaluate, what the progress line adds); the loop does the
// rest the same way for every model: the optimizer and its schedule, the Trainer step with the
// memory techniques, resuming from and writing checkpoints, metrics.csv, progress lines, peak
// memory per step, step-time medians, --profile and Ctrl-C.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/data_parallel_options.h"
#include "apps/model_parallel_options.h"
#include "apps/model_parallel_run.h"
#include "apps/progress.h"
#include "apps/run_dir.h"
#include "apps/step_meters.h"
#include "apps/technique_options.h"
#include "data/data_loader.h"
#include "models/nn/module.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/device_memory.h"
#include "parallel/pipeline.h"

namespace mg {

// --optimizer: AdamW (betas 0.9, 0.999), AdamW with 8-bit block-wise moments (optim/adamw8bit.h),
// or SGD (with --momentum; 0 keeps no state at all).
enum class OptimizerKind { adamw, adamw8bit, sgd };
OptimizerKind parse_optimizer_kind(const std::string& s);  // "adamw", "adamw8bit", "sgd"
std::string optimizer_kind_name(OptimizerKind k);

// The settings every training command has. Commands derive their options from it and set their
// own defaults (GPT: batch 8, lr 3e-4, clipping at 1; MobileNetV2: batch 64, lr 1e-3, no clipping).
struct TrainOptions {
  int64_t batch = 8;
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr = 3e-4;                 // peak of the cosine schedule
  double weight_decay = 0.01;       // on parameters of rank >= 2 only (decoupled for AdamW)
  double momentum = 0.9;            // SGD only
  double grad_clip = 0.0;           // clip the global gradient norm to this; 0: off
  int64_t warmup = -1;              // warmup steps; -1: 5% of the steps
  double min_lr_ratio = 0.1;        // the schedule ends at lr * min_lr_ratio
  uint64_t seed = 1;                // weights, data order and dropout all derive from it
  std::string device = "cpu:0";
  std::string memory_limit{};       // device budget, e.g. "512MiB"
  // --plan: "auto" (memgrad plan's candidates) or a list in bench's syntax: the run's techniques are
  // the fastest plan predicted to fit memory_limit (apps/run_plan.h); "": the technique flags'.
  std::string plan{};
  // --plan-calibrate: how --plan estimates each candidate's time: "flops" (FLOPs and bytes at this
  // machine's rates, instant) or "steps" (timed micro-steps of the run's own model, cached; ranks
  // better, apps/step_pieces.h).
  std::string plan_calibrate = "flops";
  std::string out{};                // run directory of a new run ("" = runs/<name>-<date>-<time>)
  std::string resume{};             // run directory to continue (its config.json decides the rest)
  int64_t checkpoint_every = 0;     // steps between checkpoints; 0: the command's default points
  bool save_checkpoints = true;     // false: no checkpoint at all (`memgrad bench`; not resumable)
  TechniqueOptions techniques{};    // checkpointing, precision, accumulation, auto-fit, offload
  ModelParallelOptions parallel{};  // the model split over several devices, pipelined or not
  ProgressStyle progress = ProgressStyle::automatic;
  int64_t stop_after = -1;          // stop after this many steps without the final checkpoint (tests)
  DataParallelOptions data_parallel{};  // --ddp, --zero, --bucket-mb (apps/ddp_setup.h)

  // Checks the values a new run takes from these options (resumed runs take them from config.json).
  void validate(const std::string& cmd) const;
  // The devices --memory-limit may name: the split model's, else --device and the --devices a
  // --plan may split over.
  std::vector<Device> budgeted_devices() const;
  // The schedule of a new run of total_steps steps.
  LrSchedule schedule(int64_t total_steps) const;
  // config.json's "optimizer", "schedule", "seed", "batch", "checkpoint_every", "device", "techniques".
  nlohmann::json to_config(const LrSchedule& sched) const;
  // The same settings back from a run's config.json (resuming); device, budget, progress,
  // stop_after, auto-fit and profile stay this process's own. Returns the run's schedule.
  LrSchedule read_config(const nlohmann::json& config, const std::string& cmd);
};

class DistributedDataParallel;
class AutoFit;
// The optimizer `o` asks for over `model`'s parameters (no weight decay on rank < 2); under ZeRO
// over this rank's shards of them (`ddp`).
std::unique_ptr<Optimizer> make_optimizer(const TrainOptions& o, Module& model, const DistributedDataParallel* ddp = nullptr);

// What the loop reports; the commands' results add their own fields.
struct TrainResult {
  std::string run_dir{};
  int64_t first_step = 0;      // 0, or the checkpoint's step when resuming
  int64_t steps_done = 0;      // the step count when training stopped
  double last_loss = 0.0;
  double ms_per_step = 0.0;    // median over this process's steps after the first
  double items_per_s = 0.0;    // tokens or images per second of the median step
  int64_t peak_bytes = 0;      // the run's peak allocated bytes on the device (split: the largest device's)
  // A model split over devices: each device's steady-state peak and category peaks (steps after
  // the first), in placement order; empty on one device.
  std::vector<DevicePeak> device_peaks{};
  int64_t num_parameters = 0;
  StepMemory memory{};         // steady-state peaks per category (steps after the first)
  int64_t micro_batch = 0;     // the micro-batch training ended with (0: whole batch)
  int64_t skipped_steps = 0;   // fp16 steps skipped for inf/NaN gradients
  int64_t offloaded_bytes = 0; // the most saved-activation bytes one step parked on the offload device
  bool interrupted = false;    // stopped by Ctrl-C (a checkpoint was written first)
  // --ddp, medians over the steps after the first: the communication thread's time in the
  // gradient collectives, and the part of it backward did not hide (the step waited for it).
  double comm_ms = 0.0, exposed_comm_ms = 0.0;
};

// An evaluation the task ran after a step: its value (metrics.csv's evaluation column) and an
// optional line for the log.
struct Evaluation {
  double value = 0.0;
  std::string note{};
};

// What a command plugs into the loop.
struct TrainingTask {
  std::string command;               // "gpt train": names log lines and errors
  std::string unit;                  // throughput unit, "tok/s" or "img/s"
  int64_t items_per_example = 1;     // tokens per sequence, or 1 image
  std::string eval_column;           // metrics.csv's column of Evaluation::value ("val_loss")
  std::vector<std::string> notes{};  // lines printed before the first step
  std::string header{};              // "gpt-mini (N parameters), batch ..." (the loop adds the rest)
  // The mean loss over examples [begin, begin + count) of the batch (the graph on).
  std::function<Tensor(const Batch&, int64_t begin, int64_t count)> micro_loss;
  // How many terms that mean is over (counted targets); unset: one per example.
  std::function<double(const Batch&, int64_t begin, int64_t count)> micro_weight{};
  // After `steps_done` steps: an evaluation when one is due, else nothing. `micro_batch`: the
  // examples per forward the steps now run (0: the whole batch; --micro-batch, or what --auto-fit
  // lowered it to): the evaluation forwards no more at once, so it fits where the steps do.
  std::function<std::optional<Evaluation>(int64_t steps_done, int64_t micro_batch)> evaluate;
  // Whether a checkpoint is due after `steps_done` steps (the loop also writes one at the end
  // and when interrupted).
  std::function<bool(int64_t steps_done)> checkpoint_due;
  // Extra text of the progress line ("lr 3.0e-04  val 1.234").
  std::function<std::string(int64_t steps_done, double lr)> progress_extra;
  // --pipeline: the model's stages over micro-batches of `micro` examples of the batch
  // (parallel/pipeline.h), run by the placement's schedule.
  std::function<PipelineStages(const Batch&, const std::vector<int64_t>& stage_blocks, int64_t micro)> pipeline_stages{};
  // Sets the model's checkpoint policy: for a run that switches plans (--auto-fit with a planner,
  // or resuming after it switched).
  std::function<void(const CheckpointPolicy&)> set_checkpoint{};
};

// Where the loop runs: the command's model (on `device`, precision and checkpointing applied),
// its training loader, run directory and schedule.
struct TrainingSetup {
  const TrainOptions& options;
  Device device;
  RunDir& run;
  Module& model;
  DataLoader& loader;
  LrSchedule schedule;
  int64_t total_steps = 0;
  bool resuming = false;
  uint64_t dropout_seed = 0;  // where a new run's dropout stream starts (a resumed run restores it)
  const ModelParallelRun* parallel = nullptr;  // the model's placement over devices (place_model)
  // --auto-fit's planner (apps/run_plan.h): on out-of-memory the run switches to its next plan;
  // null: auto-fit only halves the micro-batch.
  const AutoFit* auto_fit = nullptr;
};

// Trains from the run's checkpoint (or from the start) to total_steps, or until interrupted.
TrainResult train_loop(const TrainingSetup& setup, const TrainingTask& task);

}  // namespace mg
