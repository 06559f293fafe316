// `memgrad prune --sweep 0,0.25,0.5,0.75`: the memory/quality curve of pruning one trained run.
// Every amount is pruned (structured or unstructured, as --method says) into its own run
// directory under --out, fine-tuned the same number of steps (so amount 0 is the fair
// baseline: the unpruned model with the same fine-tune), then measured with the allocator:
// parameter bytes, stored weight bytes, training peak and median step time (a `memgrad bench`
// row, technique none), inference peak (one no-grad forward of a batch), and accuracy (vision)
// or validation loss (gpt) after the fine-tune. Written as sweep.csv and a self-contained
// sweep.html (inline SVG line charts, no scripts or styles from elsewhere).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "apps/prune_run.h"

namespace mg {

struct SweepPoint {
  double amount = 0.0;
  std::string run_dir{};
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;     // allocator, category parameter (dense in memory)
  int64_t stored_weight_bytes = 0;  // structured: = parameter bytes; unstructured: the sparse file's tensor bytes
  double sparsity = 0.0;            // unstructured: of the Linear/Conv2d weights
  int64_t train_peak = 0;           // bench row: peak allocated bytes of a training step
  double ms_per_step = 0.0;         // bench row: median step time
  int64_t inference_peak = 0;       // peak allocated bytes of a no-grad forward of one batch, weights included
                                    // (unstructured GPT: sparse layers where sparse enough)
  double quality_pruned = 0.0, quality_finetuned = 0.0;  // accuracy (vision) or val loss (gpt); NaN if not measured
};

struct SweepResult {
  std::string kind{}, method{}, out_dir{};  // kind: gpt | vision
  int64_t finetune_steps = 0, bench_steps = 0;
  std::vector<SweepPoint> points;
  std::string table() const;  // what `memgrad prune --sweep` prints
};

// "0,0.25,0.5" -> {0, 0.25, 0.5}; each in [0, 1), at least one, no repeats. Throws naming the bad entry.
std::vector<double> parse_sweep(const std::string& text);

// Prunes options.run at every amount into options.out/amount-<a> and measures each (see above).
// options.amount is ignored; options.bench_steps (0: 5) sets the bench steps of every point.
SweepResult prune_sweep(const PruneOptions& options, const std::vector<double>& amounts);

void write_sweep_csv(const SweepResult& r, const std::string& path);
void write_sweep_html(const SweepResult& r, const std::string& path);

// Peak allocated bytes on the host of one no-grad eval-mode forward of a batch of the run's batch
// size, with the model loaded as the eval commands load it (a magnitude-pruned GPT with its sparse
// layers), its weights included (not the loading's transient).
int64_t inference_peak_bytes(const RunDir& run);

}  // namespace mg
