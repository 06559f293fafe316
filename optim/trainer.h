// Trainer: one training step that combines the memory techniques the apps switch on. A batch of
// B examples runs as micro-batches of M (gradient accumulation: each micro loss is weighted by
// its share of the batch, so the summed gradients are the full batch's), under autocast (bf16 /
// fp16, the latter with a GradScaler), with saved activations offloaded to another device if
// asked, then one clipped optimizer step and the gradients dropped. With auto_fit, a step that
// runs out of memory is undone (gradients dropped, batch-norm buffers and random streams put
// back) and retried on the same batch with half the micro-batch, or with whatever `refit` (the
// planner, apps/auto_fit.h) switches to; no example is skipped.
// Model-specific parts (checkpoint policy, dtype of bf16-pure parameters) are set on the model.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "models/nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/gradient_sync.h"
#include "optim/optimizer.h"
#include "optim/precision.h"

namespace mg {

class Trainer;

struct TrainerOptions {
  int64_t micro_batch = 0;     // examples per forward/backward; 0: the whole batch
  bool auto_fit = false;       // on OutOfMemoryError: halve the micro-batch and retry the batch
  Precision precision = Precision::fp32;
  double grad_clip = 0.0;      // clip the global gradient norm to this; 0: off
  std::optional<Device> offload_activations{};  // park saved activations on this device
  GradScalerOptions scaler{};  // fp16 only
  // Data parallelism (parallel/ddp.h): gradients summed over ranks; not owned. fp16 loss scaling
  // and auto_fit are refused with it (ranks would decide differently and diverge).
  GradientSync* sync = nullptr;
  // auto_fit's next move after an attempt with micro-batch `micro` ran out of memory and was undone:
  // it may switch the model's checkpointing and this Trainer's precision, offload and micro-batch
  // (set_techniques) and return true to retry with them, or return false to halve the micro-batch.
  std::function<bool(Trainer& trainer, const OutOfMemoryError& error, int64_t micro)> refit{};
};

struct StepReport {
  double loss = 0.0;          // the batch's mean loss (micro losses weighted by their terms); NaN on meta
  int64_t micro_batch = 0;    // the micro-batch the step finally ran with
  int64_t micro_steps = 0;    // forward/backward passes of that successful attempt
  int64_t retries = 0;        // attempts undone after an OutOfMemoryError (auto_fit)
  bool stepped = true;        // false when fp16 loss scaling skipped the update (inf/NaN)
  double grad_norm = 0.0;     // before clipping (0 when clipping is off)
  double loss_scale = 1.0;    // fp16: the scale used for this step
  int64_t offloaded_bytes = 0;
};

class Trainer {
 public:
  // micro_loss(begin, count): the mean loss over examples [begin, begin + count) of the batch,
  // computed with the graph on (the Trainer sets autocast and offload around it).
  using MicroLoss = std::function<Tensor(int64_t begin, int64_t count)>;
  // micro_weight(begin, count): how many terms the mean of micro_loss(begin, count) is taken
  // over, e.g. the targets that are not ignored. Without one, each example counts once.
  using MicroWeight = std::function<double(int64_t begin, int64_t count)>;

  Trainer(Module& model, Optimizer& opt, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One step over a batch of batch_size examples. The optimizer's state is allocated before the
  // first forward (Optimizer::allocate_state), so the first step's peak is every step's.
  StepReport step(int64_t batch_size, const MicroLoss& micro_loss, const MicroWeight& micro_weight = {});

  // run(weights, loss_scale): every forward and backward of a batch in micro-batches, driven by
  // something else (a pipeline schedule, parallel/pipeline.h). Micro-batch i's loss is multiplied
  // by weights[i] * loss_scale before its backward; returns the batch's loss, sum of weights[i] *
  // loss_i.
  using ScheduledBatch = std::function<double(const std::vector<double>& weights, double loss_scale)>;
  // One step whose micro-batches `run` drives: the Trainer gives it the accumulation weights of
  // micro-batches of options().micro_batch examples (Note [Accumulation weights]) and the fp16
  // loss scale, runs it under autocast, then unscales, clips and steps as step() does. Auto-fit
  // and activation offload are not available on this path.
  StepReport step_scheduled(int64_t batch_size, const ScheduledBatch& run, const MicroWeight& micro_weight = {});

  const TrainerOptions& options() const { return opt_; }
  // The micro-batch the next step starts with (auto_fit lowers it and keeps it lowered).
  int64_t micro_batch() const { return micro_; }
  GradScaler* scaler() { return scaler_.get(); }
  // Switches the next attempts to this precision (autocast only: fp32 <-> bf16 <-> fp16 without
  // the loss scaler; a parameter dtype change such as bf16-pure is the model's), offload target
  // and micro-batch (0: whole batch). For refit and for a resumed run that had switched.
  void set_techniques(Precision precision, std::optional<Device> offload, int64_t micro_batch);
  // {"micro_batch", "scaler"}: what a checkpoint keeps so a resumed run steps alike.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

 private:
  // One attempt at the whole batch with micro-batch m; throws OutOfMemoryError unchanged.
  void accumulate(int64_t batch_size, int64_t m, const MicroLoss& micro_loss, const MicroWeight& micro_weight,
                  StepReport& r);
  // Each micro-batch's share of the batch's terms (Note [Accumulation weights]).
  // Under data parallelism the shares are of the global batch (every rank's terms summed).
  std::vector<double> accumulation_weights(int64_t batch_size, int64_t m, const MicroWeight& micro_weight) const;
  // Unscale (fp16), clip, step (or skip an overflowed fp16 step), drop the gradients.
  void update(StepReport& r);

  Module& model_;
  Optimizer& optimizer_;
  TrainerOptions opt_;
  int64_t micro_ = 0;  // 0: whole batch
  std::unique_ptr<GradScaler> scaler_;
};

}  // namespace mg
