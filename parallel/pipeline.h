// Pipeline execution: a model cut into stages runs a PipelineSchedule over micro-batches. A
// stage's input is the previous stage's output detached into a leaf, so each (stage,
// micro-batch) has its own graph; its backward is seeded with the gradient the next stage left
// in that leaf. Gradients accumulate into the parameters in micro-batch order, so they equal a
// plain micro-batched run (Note [Micro-batch random streams] for dropout). Steps run in the
// schedule's order on the calling thread.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "models/gpt.h"
#include "parallel/schedule.h"

namespace mg {

// Note [Micro-batch random streams]: micro-batch m draws its dropout masks from the default
// generator at offset base + m * 2^40, whatever order the stages run it in; a plain
// micro-batched run that starts each micro-batch there draws the same masks. After the batch
// the generator stands at micro_batch_stream(base, M).
uint64_t micro_batch_stream(uint64_t base, int64_t micro_batch);

struct PipelineStages {
  int64_t count = 0;
  // Stage s on micro-batch m. Stage 0 gets an undefined x and reads the micro-batch itself;
  // stage s > 0 gets stage s-1's output; the last stage returns the micro-batch's mean loss.
  std::function<Tensor(int64_t stage, int64_t micro_batch, const Tensor& x)> forward;
};

// A GPT's blocks in stages of counts[s] blocks (embeddings before stage 0; ln_f, the tied head
// and the loss after the last), over micro-batches of `micro` rows of idx / targets (B, T).
// Each stage runs its blocks under the GPT's checkpoint policy (checkpoint_sequential).
PipelineStages gpt_pipeline_stages(GPT& gpt, const std::vector<int64_t>& counts, const Tensor& idx,
                                   const Tensor& targets, int64_t micro);

// ceil(batch / micro) micro-batches; micro must be in [1, batch].
int64_t num_micro_batches(int64_t batch, int64_t micro);

// Runs the schedule; micro-batch m's loss is multiplied by weights[m] (its share of the batch's
// terms, all > 0) and then by loss_scale (fp16 loss scaling) before its backward, as
// optim/Trainer does. Returns the sum of weights[m] * loss_m; the gradients are in the parameters.
double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, const std::vector<double>& weights,
                    double loss_scale = 1.0);
// The same with each micro-batch weighted by its rows (rows / batch).
double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, int64_t batch, int64_t micro);

}  // namespace mg
