// `memgrad prune` as a library call: reads a trained run directory (gpt train or vision train),
// prunes its model structurally (models/compress/structured_prune.h: a smaller dense model, its
// optimizer state cut the same way) or by magnitude (magnitude_prune.h: masks + a sparse copy of
// the weights), writes a new run directory every command loads (vision eval, gpt sample, train
// --resume), optionally fine-tunes it through gpt_train / vision_train, and measures with the
// allocator: parameter bytes, and with --bench-steps the training peak and step time of both.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "apps/bench.h"
#include "apps/progress.h"
#include "apps/run_dir.h"
#include "models/compress/gradual_schedule.h"
#include "models/compress/magnitude_prune.h"
#include "optim/optimizer.h"

namespace mg {

struct PruneOptions {
  std::string run{};                 // the trained run directory
  std::string out{};                 // the new run directory (must not hold a checkpoint)
  std::string method = "structured";  // structured | unstructured | 2:4 (2 of every 4 weights, stored 2:4)
  double amount = 0.5;               // fraction of units (structured) or weights (unstructured), [0, 1)
  std::string criterion = "l1";      // l1 | l2 | bn | taylor (unstructured: l1, the magnitude)
  std::string scope = "layer";       // layer | global
  std::string target{};              // GPT: mlp (default) | heads | mlp+heads; MobileNetV2: expansion
  int64_t taylor_batches = 4;        // batches of the run's training data the taylor criterion reads
  int64_t finetune_steps = 0;        // training steps after pruning (0: none)
  double finetune_lr = 0.0;          // > 0: the fine-tune's own cosine from this rate; 0: the run's schedule stretched
  std::string schedule = "oneshot";  // unstructured: oneshot (all at once) | gradual (cubic, while fine-tuning)
  // > 0: the fine-tune also matches the unpruned run's soft targets with this weight
  // (models/compress/distillation.h; vision runs); 0: labels only.
  double distill = 0.0;
  double distill_temperature = 4.0;
  int64_t bench_steps = 0;           // > 0: `memgrad bench` rows (technique none) of both models
  bool evaluate_source = true;       // measure the source run's quality too (a sweep does it once)
  ProgressStyle progress = ProgressStyle::automatic;
};

struct PruneResult {
  std::string out_dir{}, kind{};  // kind: "gpt" or "vision"
  std::string method{};           // as given: structured, unstructured or 2:4
  int64_t parameters_before = 0, parameters_after = 0;
  int64_t parameter_bytes_before = 0, parameter_bytes_after = 0;  // allocator, category parameter
  // unstructured: the masked weights' sparsity, the masks' bytes, and those weights' bytes dense
  // vs stored in model.sparse.safetensors (bitmask + values)
  double sparsity = 0.0;
  int64_t mask_bytes = 0, dense_weight_bytes = 0, sparse_weight_bytes = 0;
  int64_t stored_bytes = 0;  // unstructured: tensor bytes of the whole model in model.sparse.safetensors
  // quality: accuracy (vision) or validation loss (gpt); NaN when not measured
  double quality_before = 0.0, quality_pruned = 0.0, quality_finetuned = 0.0;
  int64_t finetune_steps = 0;
  std::optional<BenchRow> bench_before{}, bench_after{};
};

PruneResult prune_run(const PruneOptions& options);
std::string prune_report(const PruneResult& r);  // what `memgrad prune` prints

// The `memgrad bench` row (technique none, `steps` steps, the run's batch and data) of the model
// a run directory's config describes, trained from scratch in `dir` (removed first).
BenchRow bench_pruned_run(const RunDir& run, int64_t steps, const std::string& dir);

// When `run` was pruned by magnitude, the masks from its masks.safetensors, applied to `model`
// now and after every step of `opt` (what the training loops call after creating the optimizer,
// so fine-tuning and --resume keep the pruned weights at zero); nullptr otherwise. With a gradual
// schedule in the run's config the masks also rise to the schedule's sparsity: at once to its
// value at `step` (the step the run resumes at), then on its update steps.
std::unique_ptr<MagnitudeMask> attach_prune_masks(const RunDir& run, Module& model, Optimizer& opt, int64_t step);

}  // namespace mg
