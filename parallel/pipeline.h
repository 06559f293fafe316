// Pipeline execution: a model cut into stages runs a PipelineSchedule over micro-batches. A
// stage's input is the previous stage's output detached into a leaf, so each (stage,
// micro-batch) has its own graph; its backward is seeded with the gradient the next stage left
// in that leaf. Gradients accumulate into the parameters in micro-batch order, so they equal a
// plain micro-batched run (Note [Micro-batch random streams] for dropout). Each stage runs on a
// worker thread of its own with its share of the cores (Note [Pipeline workers]); the same steps
// can run one after another on the calling thread, with bit-identical results.
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
  // Stages whose backwards write the gradient of one same parameter (GPT: the first and the last,
  // through the tied wte): their backwards run in the schedule's order, one at a time, so the
  // gradient's sum has the same order (and bits) however the workers are timed.
  std::vector<int64_t> tied_stages{};
  // Stage s's device, where its input leaf is copied (empty: the leaf stays where the previous
  // stage left it). Note [Boundary gradients]: the gradient of that leaf is then made on stage s's
  // device and copied to stage s-1's only when stage s-1 runs that micro-batch's backward, so a
  // stage's memory holds its own micro-batches and never gradients that a faster neighbour sent
  // ahead (which made the first stage's peak depend on the workers' timing).
  std::vector<Device> devices{};
};

// How run_pipeline executes the schedule. Note [Pipeline workers]: with `workers`, stage s runs
// its own steps in schedule order on thread s, which gets 1/p of the calling thread's OpenMP
// threads (at least one) and its autocast state; activations go down and gradients go up
// through mailboxes keyed by (stage, micro-batch). Deadlock-free by construction: each wait (an
// input from a neighbouring stage, a tied stage's turn) is for a step earlier in the schedule's
// list, and every stage runs its steps in list order, so the earliest unfinished step of the list
// can always run. A cuda:N stage runs on its worker thread too (each op sets its device) and
// enqueues on cuda:N's stream: stages on different GPUs overlap on their own streams, stages on
// one GPU share its stream, each thread has its own cuBLAS/cuDNN handles, and a copy between
// GPUs is ordered by events, not host waits (Note [Streams and threads], core/cuda/context.cpp).
// `sequential` runs the list in order on the calling thread (the reference the workers are
// tested against).
enum class PipelineExecution { workers, sequential };

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
// A worker's error (out of memory on its device, ...) stops the others and is rethrown here.
double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, const std::vector<double>& weights,
                    double loss_scale = 1.0, PipelineExecution execution = PipelineExecution::workers);
// The same with each micro-batch weighted by its rows (rows / batch).
double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, int64_t batch, int64_t micro,
                    PipelineExecution execution = PipelineExecution::workers);

}  // namespace mg
