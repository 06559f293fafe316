// Trainer (see trainer.h). Note [Accumulation weights]: micro-batch i of n_i examples contributes
// (n_i / B) * mean_i to the loss, so sum_i of those is the batch mean and the accumulated
// gradients are the full batch's up to float rounding (exact only when there is one micro-batch).
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

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  if (s == "bf16-pure") return Precision::bf16_pure;
  MG_THROW("--precision: unknown value '", s, "'; expected fp32, bf16, fp16 or bf16-pure");
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::bf16_pure: return "bf16-pure";
  }
  return "?";
}

DType parameter_dtype(Precision p) { return p == Precision::bf16_pure ? DType::bf16 : DType::f32; }

void apply_precision(Module& model, Precision p) {
  if (p == Precision::bf16_pure) model.to(DType::bf16);
}

Trainer::Trainer(Module& model, Optimizer& opt, TrainerOptions options)
    : model_(model), optimizer_(opt), opt_(options), micro_(options.micro_batch) {
  MG_CHECK(opt_.micro_batch >= 0, "Trainer: --micro-batch must be >= 0 (0: the whole batch), got ", opt_.micro_batch);
  MG_CHECK(opt_.grad_clip >= 0 && std::isfinite(opt_.grad_clip), "Trainer: grad_clip must be >= 0, got ",
           opt_.grad_clip);
  if (opt_.precision == Precision::fp16) scaler_ = std::make_unique<GradScaler>(opt_.scaler);
}

Trainer::~Trainer() = default;

void Trainer::accumulate(int64_t batch_size, int64_t m, const MicroLoss& micro_loss, StepReport& r) {
  const bool amp = opt_.precision == Precision::bf16 || opt_.precision == Precision::fp16;
  const DType low = opt_.precision == Precision::fp16 ? DType::f16 : DType::bf16;
  r.micro_batch = m;
  r.micro_steps = 0;
  r.loss = 0.0;
  r.offloaded_bytes = 0;
  for (int64_t begin = 0; begin < batch_size; begin += m) {
    const int64_t count = std::min(m, batch_size - begin);
    const double weight = double(count) / double(batch_size);  // Note [Accumulation weights]
    Tensor loss, scaled;
    {
      StepPhaseGuard phase(StepPhase::forward);
      AutocastGuard autocast(low, amp);
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
    r.loss += weight * loss.item();
    r.micro_steps += 1;
  }
}

StepReport Trainer::step(int64_t batch_size, const MicroLoss& micro_loss) {
  MG_CHECK(batch_size > 0, "Trainer.step: the batch is empty");
  MG_CHECK(bool(micro_loss), "Trainer.step: no loss function");
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
      accumulate(batch_size, m, micro_loss, r);
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
      if (m == 1)
        throw OutOfMemoryError(detail::str_cat("auto-fit: even a micro-batch of 1 example does not fit in the memory budget; what the "
                     "failed attempt saw:\n", e.what(),
                     "\n  hint: lower the model's memory (--checkpoint blocks, --precision bf16-pure) or raise "
                     "--memory-limit"));
      m = (m + 1) / 2;
      r.retries += 1;
    }
  }
  micro_ = m < batch_size || micro_ > 0 ? m : 0;

  // The update: unscale (fp16), clip, step (or skip an overflowed fp16 step), drop the gradients.
  StepPhaseGuard phase(StepPhase::optimizer);
  std::vector<Tensor> params;
  for (const auto& g : optimizer_.param_groups())
    for (const auto& [_, p] : g.params) params.push_back(p);
  bool finite = true;
  if (scaler_) finite = scaler_->unscale(optimizer_);
  if (opt_.grad_clip > 0 && finite) r.grad_norm = clip_grad_norm(params, opt_.grad_clip);
  if (scaler_) {
    r.stepped = scaler_->step(optimizer_);
  } else {
    optimizer_.step();
  }
  optimizer_.zero_grad();
  return r;
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
