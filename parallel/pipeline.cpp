// Pipeline execution: the boundary leaves between stages, per-micro-batch random streams, the
// loss weights, and the GPT cut into stages.
#include "parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "autograd/checkpoint.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "core/generator_scope.h"
#include "core/parallel.h"
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
  st.tied_stages = {0, st.count - 1};  // the embedding and the head share wte
  for (int64_t s = 0; s < st.count; ++s)  // where the stage's first block reads its input
    st.devices.push_back(gpt.h->at<Block>(size_t(begin[size_t(s)]))->ln_1->weight.device());
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

double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, int64_t batch, int64_t micro,
                    PipelineExecution execution) {
  const int64_t M = num_micro_batches(batch, micro);
  std::vector<double> weights;
  for (int64_t m = 0; m < M; ++m) weights.push_back(double(std::min(micro, batch - m * micro)) / double(batch));
  return run_pipeline(schedule, stages, weights, 1.0, execution);
}

namespace {

// Thrown in a worker whose wait was cut short because another worker failed.
struct PipelineAborted {};

// What crosses between stages: stage s's output for micro-batch m goes to (activation, s + 1, m);
// the gradient of stage s's input goes to (gradient, s - 1, m); plus the turn of the tied stages.
class Mailboxes {
 public:
  enum class Kind { activation, gradient };
  void put(Kind k, int64_t stage, int64_t m, Tensor t) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      box_[{int(k), stage, m}] = std::move(t);
    }
    cv_.notify_all();
  }
  Tensor take(Kind k, int64_t stage, int64_t m) {
    std::unique_lock<std::mutex> lk(mu_);
    const std::tuple<int, int64_t, int64_t> key{int(k), stage, m};
    cv_.wait(lk, [&] { return aborted_ || box_.count(key); });
    if (aborted_) throw PipelineAborted{};
    Tensor t = std::move(box_.at(key));
    box_.erase(key);
    return t;
  }
  void wait_turn(int64_t turn) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return aborted_ || turn_ == turn; });
    if (aborted_) throw PipelineAborted{};
  }
  void next_turn() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++turn_;
    }
    cv_.notify_all();
  }
  void abort() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      aborted_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int64_t, int64_t>, Tensor> box_;
  int64_t turn_ = 0;
  bool aborted_ = false;
};

// One pipelined batch: the steps' bodies, shared by both executions.
class PipelineRun {
 public:
  PipelineRun(const PipelineSchedule& schedule, const PipelineStages& stages, const std::vector<double>& weights,
              double loss_scale)
      : schedule_(schedule), stages_(stages), weights_(weights), loss_scale_(loss_scale) {
    const int64_t p = stages.count, M = int64_t(weights.size());
    in_.assign(size_t(p), std::vector<Tensor>(size_t(M)));
    out_ = in_;
    // Note [Micro-batch random streams]: micro-batch m's stream, as its own generator object, so
    // workers draw concurrently; checkpointing records (and later rewinds) that object.
    const Generator& g = default_generator();
    for (int64_t m = 0; m < M; ++m) {
      gens_.emplace_back(g.seed());
      gens_.back().set_offset(micro_batch_stream(g.offset(), m));
    }
    int64_t turn = 0;
    for (const PipelineStep& st : schedule.steps) {
      const bool tied = st.kind == PipelineStep::Kind::backward &&
                        std::find(stages.tied_stages.begin(), stages.tied_stages.end(), st.stage) != stages.tied_stages.end();
      turn_.push_back(tied ? turn++ : -1);
    }
  }

  void run(size_t i) {
    const PipelineStep& step = schedule_.steps[i];
    const int64_t s = step.stage, m = step.micro_batch, last = stages_.count - 1;
    using K = Mailboxes::Kind;
    DefaultGeneratorScope stream(gens_[size_t(m)]);
    Tensor& in = in_[size_t(s)][size_t(m)];
    Tensor& out = out_[size_t(s)][size_t(m)];
    if (step.kind == PipelineStep::Kind::forward) {
      StepPhaseGuard phase(StepPhase::forward);
      Tensor x;
      if (s > 0) {  // a leaf of this stage's graph; its gradient goes back up
        x = mail_.take(K::activation, s, m);
        if (!stages_.devices.empty()) x = to(x, stages_.devices[size_t(s)]);
        x = x.detach();
        x.set_requires_grad(true);
        in = x;
      }
      Tensor y = stages_.forward(s, m, x);
      if (s == last) {
        const double w = weights_[size_t(m)];
        loss_ += to(y.detach(), kCPU).item<double>() * w;
        y = mul(y, w);
        if (loss_scale_ != 1.0) y = mul(y, loss_scale_);
      } else {
        mail_.put(K::activation, s + 1, m, y);
      }
      out = y;
      return;
    }
    StepPhaseGuard phase(StepPhase::backward);
    MG_INTERNAL_ASSERT(out.defined(), "pipeline: backward of stage ", s, " micro-batch ", m, " before its forward");
    const Tensor g = s == last ? Tensor() : mail_.take(K::gradient, s, m);
    if (s != last) MG_INTERNAL_ASSERT(g.defined(), "pipeline: stage ", s + 1, " left no gradient for micro-batch ", m);
    if (turn_[i] >= 0) mail_.wait_turn(turn_[i]);
    if (g.defined()) backward(out, to(g, out.device()));  // Note [Boundary gradients]
    else backward(out);
    if (turn_[i] >= 0) mail_.next_turn();
    out = Tensor();  // the micro-batch's activations on this stage are gone
    if (s > 0) {
      mail_.put(K::gradient, s - 1, m, in.grad());
      in = Tensor();
    }
  }

  double sequential() {
    for (size_t i = 0; i < schedule_.steps.size(); ++i) run(i);
    return loss_;
  }

  double workers() {
    const int64_t p = stages_.count;
    const int share = std::max(1, num_threads() / int(p));
    const AutocastState autocast = autocast_state();
    std::mutex error_mu;
    std::exception_ptr error;
    std::vector<std::thread> threads;
    for (int64_t s = 0; s < p; ++s) {
      threads.emplace_back([&, s] {
        try {
          set_num_threads(share);
          AutocastGuard amp(autocast);
          for (size_t i = 0; i < schedule_.steps.size(); ++i)
            if (schedule_.steps[i].stage == s) run(i);
        } catch (const PipelineAborted&) {
          // another worker failed first; its error is the one rethrown
        } catch (...) {
          {
            std::lock_guard<std::mutex> lk(error_mu);
            if (!error) error = std::current_exception();
          }
          mail_.abort();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (error) {
      in_.clear();  // the graphs and activations of the unfinished micro-batches go now
      out_.clear();
      std::rethrow_exception(error);
    }
    return loss_;
  }

 private:
  const PipelineSchedule& schedule_;
  const PipelineStages& stages_;
  const std::vector<double>& weights_;
  double loss_scale_;
  std::vector<Generator> gens_;
  std::vector<std::vector<Tensor>> in_;   // [stage][micro-batch]: boundary leaves
  std::vector<std::vector<Tensor>> out_;  // [stage][micro-batch]: graph roots
  std::vector<int64_t> turn_;             // per step of the list: its turn among the tied backwards, or -1
  Mailboxes mail_;
  double loss_ = 0;                       // written by the last stage only
};

}  // namespace

double run_pipeline(const PipelineSchedule& schedule, const PipelineStages& stages, const std::vector<double>& weights,
                    double loss_scale, PipelineExecution execution) {
  const int64_t p = stages.count, M = int64_t(weights.size());
  MG_CHECK(schedule.stages == p && schedule.micro_batches == M, "run_pipeline: the schedule is for ", schedule.stages,
           " stages x ", schedule.micro_batches, " micro-batches, the run has ", p, " x ", M);
  for (double w : weights)
    MG_CHECK(w > 0 && std::isfinite(w), "run_pipeline: every micro-batch needs a positive weight, got ", w,
             " (a micro-batch whose every target is ignored cannot run in a pipeline)");
  for (int64_t s : stages.tied_stages)
    MG_CHECK(s >= 0 && s < p, "run_pipeline: tied stage ", s, " is not one of the ", p, " stages");
  MG_CHECK(stages.devices.empty() || int64_t(stages.devices.size()) == p, "run_pipeline: ", stages.devices.size(),
           " stage devices for ", p, " stages");
  Generator& gen = default_generator();
  const uint64_t base = gen.offset();
  double loss = 0;
  {
    PipelineRun run(schedule, stages, weights, loss_scale);
    loss = execution == PipelineExecution::workers && p > 1 ? run.workers() : run.sequential();
  }
  gen.set_offset(micro_batch_stream(base, M));
  return loss;
}

}  // namespace mg
