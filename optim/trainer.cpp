// Trainer (see trainer.h). Note [Accumulation weights]: a micro loss is a mean over its own terms
// (examples, or the targets that are not ignored), so micro-batch i with w_i terms contributes
// (w_i / sum_j w_j) * mean_i: the sum is the mean over every term of the batch and the
// accumulated gradients are the full batch's up to float rounding (exact only when there is one
// micro-batch). Weighting by examples instead is wrong as soon as micro-batches hold different
// numbers of counted targets.
// Note [Undoing a failed step]: an OutOfMemoryError can strike in any forward or backward; by
// then some gradients hold partial sums, batch-norm buffers have moved and dropout streams have
// advanced. The retry drops every gradient, copies the buffers back from a snapshot taken before
// the step, and rewinds the streams, so the successful attempt is exactly a fresh one.
#include "optim/trainer.h"

#include <algorithm>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/offload.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "optim/clip_grad.h"

namespace mg {

Trainer::Trainer(Module& model, Optimizer& opt, TrainerOptions options)
    : model_(model), optimizer_(opt), opt_(options), micro_(options.micro_batch) {
  MG_CHECK(opt_.micro_batch >= 0, "Trainer: micro_batch must be >= 0 (0: the whole batch), got ", opt_.micro_batch);
  MG_CHECK(opt_.grad_clip >= 0 && std::isfinite(opt_.grad_clip), "Trainer: grad_clip must be >= 0, got ",
           opt_.grad_clip);
  MG_CHECK(!opt_.sync || (opt_.precision != Precision::fp16 && !opt_.auto_fit),
           "Trainer: data-parallel training supports neither fp16 loss scaling nor auto-fit (ranks would decide apart)",
           "\n  hint: use bf16, and a fixed --micro-batch");
  if (opt_.precision == Precision::fp16) scaler_ = std::make_unique<GradScaler>(opt_.scaler);
}

Trainer::~Trainer() = default;

std::vector<double> Trainer::accumulation_weights(int64_t batch_size, int64_t m, const MicroWeight& micro_weight) const {
  std::vector<double> terms;
  double total = 0.0;
  for (int64_t begin = 0; begin < batch_size; begin += m) {
    const int64_t count = std::min(m, batch_size - begin);
    const double w = micro_weight ? micro_weight(begin, count) : double(count);
    MG_CHECK(w >= 0 && std::isfinite(w), "Trainer: a micro-batch's weight must be a finite count >= 0, got ", w);
    terms.push_back(w);
    total += w;
  }
  if (opt_.sync) total = opt_.sync->sum_across(total);  // the global batch's terms
  MG_CHECK(total > 0, "Trainer: the batch has nothing to average over (every target is ignored)");
  for (double& w : terms) w /= total;
  return terms;
}

void Trainer::accumulate(int64_t batch_size, int64_t m, const MicroLoss& micro_loss, const MicroWeight& micro_weight,
                         StepReport& r) {
  r.micro_batch = m;
  r.micro_steps = 0;
  r.loss = 0.0;
  r.offloaded_bytes = 0;
  const std::vector<double> weights = accumulation_weights(batch_size, m, micro_weight);
  for (int64_t begin = 0, i = 0; begin < batch_size; begin += m, ++i) {
    const int64_t count = std::min(m, batch_size - begin);
    const double weight = weights[size_t(i)];
    if (weight == 0.0) continue;  // a micro-batch without counted terms adds nothing (its mean is NaN)
    if (opt_.sync) opt_.sync->before_micro_batch(i, int64_t(weights.size()));
    Tensor loss, scaled;
    {
      StepPhaseGuard phase(StepPhase::forward);
      AutocastGuard autocast(autocast_for(opt_.precision));
      std::optional<ActivationOffload> offload;
      if (opt_.offload_activations) offload.emplace(*opt_.offload_activations);
      loss = micro_loss(begin, count);
      MG_CHECK(loss.defined() && loss.numel() == 1, "Trainer: the micro-batch loss must be a scalar, got ",
               loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"));
      scaled = mul(loss, weight);
      if (scaler_) scaled = scaler_->scale(scaled);
      if (offload) r.offloaded_bytes += offload->stats().bytes;
    }
    {
      StepPhaseGuard phase(StepPhase::backward);
      backward(scaled);
    }
    // Note [A step on meta]: meta has shapes and bytes but no values, so a step there runs every
    // allocation of the real one and reports its loss as NaN.
    r.loss += loss.is_meta() ? std::nan("") : weight * loss.item();
    r.micro_steps += 1;
  }
  if (opt_.sync) {
    StepPhaseGuard phase(StepPhase::backward);
    opt_.sync->finish_gradients();
    r.loss = opt_.sync->sum_across(r.loss);  // each rank's share of the global mean
  }
}

StepReport Trainer::step(int64_t batch_size, const MicroLoss& micro_loss, const MicroWeight& micro_weight) {
  MG_CHECK(batch_size > 0, "Trainer.step: the batch is empty");
  MG_CHECK(bool(micro_loss), "Trainer.step: no loss function");
  {
    StepPhaseGuard phase(StepPhase::optimizer);
    optimizer_.allocate_state();  // before the first forward: auto-fit then sees the whole peak at once
  }
  StepReport r;
  r.loss_scale = scaler_ ? scaler_->scale_value() : 1.0;
  // Note [Undoing a failed step]: what a retry must put back.
  NamedTensors buffers;
  if (opt_.auto_fit) {
    NoGradGuard no_grad;
    MemoryCategoryGuard other(MemoryCategory::other);
    for (const auto& [name, b] : model_.named_buffers()) buffers.emplace_back(name, clone(b));
  }
  int64_t m = micro_ > 0 ? std::min(micro_, batch_size) : batch_size;
  for (;;) {
    StreamRecorder streams;
    try {
      accumulate(batch_size, m, micro_loss, micro_weight, r);
      break;
    } catch (const OutOfMemoryError& e) {
      optimizer_.zero_grad();
      model_.zero_grad();
      if (!opt_.auto_fit) throw;
      {
        NoGradGuard no_grad;
        auto now = model_.named_buffers();
        for (size_t i = 0; i < now.size(); ++i) copy_(now[i].second, buffers[i].second);
      }
      streams.rewind();
      r.retries += 1;
      if (opt_.refit && opt_.refit(*this, e, m)) {  // the planner's next plan (set_techniques)
        m = micro_ > 0 ? std::min(micro_, batch_size) : batch_size;
        continue;
      }
      if (m == 1)
        throw OutOfMemoryError(detail::str_cat("auto-fit: even a micro-batch of 1 example does not fit in the memory budget; what the "
                     "failed attempt saw:\n", e.what(),
                     "\n  hint: lower the model's memory (activation checkpointing, bf16-pure parameters) or raise the "
                     "memory budget"));
      m = (m + 1) / 2;
    }
  }
  micro_ = m < batch_size || micro_ > 0 ? m : 0;

  update(r);
  return r;
}

StepReport Trainer::step_scheduled(int64_t batch_size, const ScheduledBatch& run, const MicroWeight& micro_weight) {
  MG_CHECK(batch_size > 0, "Trainer.step_scheduled: the batch is empty");
  MG_CHECK(bool(run), "Trainer.step_scheduled: nothing to run");
  MG_CHECK(!opt_.auto_fit && !opt_.offload_activations && !opt_.sync,
           "Trainer.step_scheduled: auto-fit, activation offload and data parallelism do not combine with a scheduled "
           "(pipelined) step");
  {
    StepPhaseGuard phase(StepPhase::optimizer);
    optimizer_.allocate_state();
  }
  StepReport r;
  r.loss_scale = scaler_ ? scaler_->scale_value() : 1.0;
  r.micro_batch = micro_ > 0 ? std::min(micro_, batch_size) : batch_size;
  const std::vector<double> weights = accumulation_weights(batch_size, r.micro_batch, micro_weight);
  r.micro_steps = int64_t(weights.size());
  try {
    AutocastGuard autocast(autocast_for(opt_.precision));  // the engine turns it off in backward
    r.loss = run(weights, r.loss_scale);
  } catch (...) {
    optimizer_.zero_grad();
    model_.zero_grad();
    throw;
  }
  update(r);
  return r;
}

void Trainer::update(StepReport& r) {
  StepPhaseGuard phase(StepPhase::optimizer);
  std::vector<Tensor> params;
  for (const auto& g : optimizer_.param_groups())
    for (const auto& [_, p] : g.params) params.push_back(p);
  try {
    bool finite = true;
    if (scaler_) finite = scaler_->unscale(optimizer_);
    if (opt_.grad_clip > 0 && finite) {
      if (opt_.sync && opt_.sync->sharded())  // each rank holds a disjoint shard of the gradients
        r.grad_norm = clip_grad_norm(params, opt_.grad_clip, [&](double sq) { return opt_.sync->sum_across(sq); });
      else
        r.grad_norm = clip_grad_norm(params, opt_.grad_clip);
    }
    if (scaler_) {
      r.stepped = scaler_->step(optimizer_);
    } else {
      optimizer_.step();
    }
  } catch (const OutOfMemoryError&) {
    // Out of memory in the update (clipping's or the optimizer's temporaries): the gradients go
    // too, so the caller's memory is what it was before the step (tests/optim/test_alloc_faults.cpp).
    optimizer_.zero_grad();
    model_.zero_grad();
    throw;
  }
  optimizer_.zero_grad();
  if (opt_.sync) opt_.sync->after_step();
}

void Trainer::set_techniques(Precision precision, std::optional<Device> offload, int64_t micro_batch) {
  MG_CHECK(micro_batch >= 0, "Trainer.set_techniques: micro_batch must be >= 0, got ", micro_batch);
  auto fixed = [](Precision p) { return p == Precision::fp16 || p == Precision::bf16_pure; };
  MG_CHECK(precision == opt_.precision || (!fixed(precision) && !fixed(opt_.precision)),
           "Trainer.set_techniques: cannot switch from ", precision_name(opt_.precision), " to ",
           precision_name(precision), " during a run (fp16 has a loss scaler, bf16-pure bf16 parameters)");
  opt_.precision = precision;
  opt_.offload_activations = offload;
  micro_ = micro_batch;
}

nlohmann::json Trainer::state() const {
  nlohmann::json j{{"micro_batch", micro_}};
  if (scaler_) j["scaler"] = scaler_->state();
  return j;
}

void Trainer::load_state(const nlohmann::json& j) {
  MG_CHECK(j.is_object() && j.contains("micro_batch") && j["micro_batch"].is_number_integer() &&
               j["micro_batch"].get<int64_t>() >= 0,
           "Trainer.load_state: expected {\"micro_batch\": N >= 0, ...}, got ", j.dump());
  micro_ = j["micro_batch"].get<int64_t>();
  if (scaler_) {
    MG_CHECK(j.contains("scaler"), "Trainer.load_state: an fp16 run's state has no \"scaler\" entry");
    scaler_->load_state(j["scaler"]);
  }
}

}  // namespace mg
