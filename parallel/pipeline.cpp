// Pipeline execution: the boundary leaves between stages, per-micro-batch random streams, the
// loss weights, and the GPT cut into stages.
#include "parallel/pipeline.h"

#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "core/memory_category.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace mg {

uint64_t micro_batch_stream(uint64_t base, int64_t micro_batch) { return base + (uint64_t(micro_batch) << 40); }

int64_t num_micro_batches(int64_t batch, int64_t micro) {
  MG_CHECK(batch >= 1 && micro >= 1 && micro <= batch, "pipeline: micro-batch ", micro, " must be in [1, batch ", batch,
           "]");
  return (batch + micro - 1) / micro;
}

PipelineStages gpt_pipeline_stages(GPT& gpt, const std::vector<int64_t>& counts, const Tensor& idx,
                                   const Tensor& targets, int64_t micro) {
  int64_t total = 0;
  for (int64_t c : counts) {
    MG_CHECK(c >= 1, "gpt_pipeline_stages: every stage needs at least one block");
    total += c;
  }
  MG_CHECK(total == int64_t(gpt.h->size()), "gpt_pipeline_stages: the stages hold ", total, " blocks but the GPT has ",
           gpt.h->size());
  MG_CHECK(idx.dim() == 2 && targets.shape() == idx.shape(), "gpt_pipeline_stages: expected idx and targets (B, T), got ",
           idx.shape(), " and ", targets.shape());
  const int64_t B = idx.size(0);
  num_micro_batches(B, micro);  // checks micro
  std::vector<int64_t> begin{0};
  for (int64_t c : counts) begin.push_back(begin.back() + c);
  PipelineStages st;
  st.count = int64_t(counts.size());
  st.forward = [&gpt, begin, idx, targets, micro, B, last = st.count - 1](int64_t s, int64_t m, const Tensor& x) {
    const int64_t row = m * micro, rows = std::min(micro, B - row);
    auto scope = gpt.forward_scope();
    Tensor h = s == 0 ? gpt.embed(narrow(idx, 0, row, rows), 0) : x;  // (b, T, C)
    // The stage's blocks under the model's checkpoint policy, as GPT::forward_hidden runs them all.
    std::vector<BlockFn> blocks;
    for (int64_t l = begin[size_t(s)]; l < begin[size_t(s + 1)]; ++l)
      blocks.push_back([block = gpt.h->at<Block>(size_t(l))](const Tensor& t) { return (*block)(t); });
    h = checkpoint_sequential(blocks, gpt.checkpoint_policy(), h);
    if (s < last) return h;
    return gpt.loss_from_hidden((*gpt.ln_f)(h), narrow(targets, 0, row, rows));
  };
  return st;
}

double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, int64_t batch, int64_t micro) {
  const int64_t M = num_micro_batches(batch, micro);
  std::vector<double> weights;
  for (int64_t m = 0; m < M; ++m) weights.push_back(double(std::min(micro, batch - m * micro)) / double(batch));
  return run_pipeline(schedule, stages, weights);
}

double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, const std::vector<double>& weights,
                    double loss_scale) {
  const int64_t p = stages.count, M = int64_t(weights.size());
  MG_CHECK(schedule.stages == p && schedule.micro_batches == M, "run_pipeline: the schedule is for ", schedule.stages,
           " stages x ", schedule.micro_batches, " micro-batches, the run has ", p, " x ", M);
  for (double w : weights)
    MG_CHECK(w > 0 && std::isfinite(w), "run_pipeline: every micro-batch needs a positive weight, got ", w,
             " (a micro-batch whose every target is ignored cannot run in a pipeline)");
  std::vector<std::vector<Tensor>> in(static_cast<size_t>(p), std::vector<Tensor>(static_cast<size_t>(M)));  // boundary leaves
  std::vector<std::vector<Tensor>> out = in;  // graph roots
  Generator& gen = default_generator();
  const uint64_t base = gen.offset();
  std::vector<uint64_t> cursor(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) cursor[size_t(m)] = micro_batch_stream(base, m);
  double loss = 0;
  for (const PipelineStep& step : schedule.steps) {
    const size_t s = size_t(step.stage), m = size_t(step.micro_batch);
    if (step.kind == PipelineStep::Kind::forward) {
      StepPhaseGuard phase(StepPhase::forward);
      Tensor x;
      if (s > 0) {
        MG_INTERNAL_ASSERT(out[s - 1][m].defined(), "pipeline: stage ", s, " runs micro-batch ", m, " before stage ", s - 1);
        x = out[s - 1][m].detach();
        x.set_requires_grad(true);
        in[s][m] = x;
      }
      gen.set_offset(cursor[m]);
      Tensor y = stages.forward(int64_t(s), int64_t(m), x);
      cursor[m] = gen.offset();
      if (int64_t(s) == p - 1) {
        const double w = weights[m];
        loss += to(y.detach(), kCPU).item<double>() * w;
        y = mul(y, w);
        if (loss_scale != 1.0) y = mul(y, loss_scale);
      }
      out[s][m] = y;
    } else {
      StepPhaseGuard phase(StepPhase::backward);
      MG_INTERNAL_ASSERT(out[s][m].defined(), "pipeline: backward of stage ", s, " micro-batch ", m, " before its forward");
      if (int64_t(s) == p - 1) {
        backward(out[s][m]);
      } else {
        const Tensor g = in[s + 1][m].grad();
        MG_INTERNAL_ASSERT(g.defined(), "pipeline: stage ", s + 1, " left no gradient for micro-batch ", m);
        backward(out[s][m], g);
        in[s + 1][m] = Tensor();
      }
      out[s][m] = Tensor();  // the micro-batch's activations on this stage are gone
    }
  }
  gen.set_offset(micro_batch_stream(base, M));
  return loss;
}

}  // namespace mg
