// One measured training step of a workload on any device (see plan_step.h). It mirrors what the
// training commands run: the model built on the device (parameters), precision and checkpointing
// applied, the commands' optimizer, the loader's batches allocated before the step (inputs), and
// one Trainer step per measurement with the commands' micro-batch loss.
#include "apps/plan_step.h"

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "optim/trainer.h"

namespace mg {

namespace {

// Module construction tags its parameters; these are the loader's batch buffers.
struct Batches {
  std::vector<std::pair<Tensor, Tensor>> held;  // (input, target), the first is the one in use
};

Batches make_batches(const PlanWorkload& w, const Device& d) {
  MemoryCategoryGuard tag(MemoryCategory::input);
  OpNameGuard op("data_loader");
  Batches b;
  for (int64_t i = 0; i <= w.prefetch; ++i) {
    if (w.is_gpt()) {
      // Token ids (B, T) and next-token targets (B, T): zeros are valid ids of every vocabulary.
      b.held.emplace_back(zeros({w.batch, w.gpt->context}, {.dtype = DType::i64, .device = d}),
                          zeros({w.batch, w.gpt->context}, {.dtype = DType::i64, .device = d}));
    } else {
      const auto& c = *w.mobilenet;
      Tensor x = empty({w.batch, c.in_channels, c.input_size, c.input_size}, {.device = d});
      if (!d.is_meta()) fill_(x, 0.5);
      b.held.emplace_back(x, zeros({w.batch}, {.dtype = DType::i64, .device = d}));
    }
  }
  return b;
}

std::shared_ptr<Module> build(const PlanWorkload& w, const Device& d) {
  Generator gen(0);  // its own stream: measuring never moves the user's
  if (w.is_gpt()) return std::make_shared<GPT>(*w.gpt, InitOptions{.gen = &gen, .device = d});
  return std::make_shared<MobileNetV2>(*w.mobilenet, InitOptions{.gen = &gen, .device = d});
}

}  // namespace

PlanWorkload PlanWorkload::named(const std::string& model, int64_t batch) {
  MG_CHECK(batch >= 0, "plan: --batch must be positive, got ", batch);
  PlanWorkload w;
  w.name = model;
  for (const auto& n : GPTConfig::names())
    if (n == model) {
      w.gpt = GPTConfig::named(model);
      w.batch = batch > 0 ? batch : 8;
      w.grad_clip = 1.0;  // GptTrainOptions
      w.prefetch = 2;     // gpt train's loader
      return w;
    }
  for (const auto& n : MobileNetV2Config::names())
    if (n == model) {
      w.mobilenet = MobileNetV2Config::named(model);
      w.batch = batch > 0 ? batch : (w.mobilenet->input_size >= 224 ? 32 : 64);
      w.prefetch = 2;  // vision train's loader
      return w;
    }
  std::string known;
  for (const auto& n : GPTConfig::names()) known += n + ", ";
  for (const auto& n : MobileNetV2Config::names()) known += n + ", ";
  MG_THROW("unknown model '", model, "' (known: ", known.substr(0, known.size() - 2), ")");
}

int64_t PlanWorkload::num_parameters() const {
  Device scratch(DeviceType::meta, kMaxDevicesPerType - 1);
  return build(*this, scratch)->num_parameters();
}

int64_t PlanWorkload::items_per_step() const { return is_gpt() ? batch * gpt->context : batch; }

StepMemory measure_step(const PlanWorkload& w, const TechniqueOptions& t, const Device& device, int steps) {
  MG_CHECK(w.gpt.has_value() != w.mobilenet.has_value(), "measure_step: a workload is one GPT or one MobileNetV2");
  MG_CHECK(w.batch > 0 && steps >= 2, "measure_step: needs a batch (got ", w.batch, ") and 2+ steps (got ", steps, ")");
  t.validate(w.batch, device);
  TechniqueOptions tech = t;
  if (device.is_meta() && tech.offload_activations) tech.offload_activations = Device(DeviceType::meta, device.index + 1);
  StreamRecorder streams;  // dropout draws: put back at the end
  empty_cache(device);
  if (tech.offload_activations) empty_cache(*tech.offload_activations);
  StepMemory out;
  {
    std::shared_ptr<Module> model = build(w, device);
    apply_precision(*model, tech.precision);
    if (w.is_gpt()) static_cast<GPT&>(*model).set_checkpoint(tech.checkpoint);
    else static_cast<MobileNetV2&>(*model).set_checkpoint(tech.checkpoint);
    TrainOptions o;
    o.optimizer = w.optimizer;
    std::unique_ptr<Optimizer> opt = make_optimizer(o, *model);
    Trainer trainer(*model, *opt, tech.trainer_options(w.grad_clip));
    PeakMeter meter(device);
    for (int s = 0; s < steps; ++s) {
      meter.begin_step();
      Batches b = make_batches(w, device);
      const Tensor& input = b.held.front().first;
      const Tensor& target = b.held.front().second;
      Trainer::MicroLoss loss;
      if (w.is_gpt()) {
        auto& gpt = static_cast<GPT&>(*model);
        loss = [&](int64_t begin, int64_t n) { return gpt.loss(narrow(input, 0, begin, n), narrow(target, 0, begin, n)); };
      } else {
        auto& net = static_cast<MobileNetV2&>(*model);
        const DType pd = net.features->parameters()[0].dtype();  // bf16-pure: the images cast like vision train's
        loss = [&, pd](int64_t begin, int64_t n) {
          Tensor x = narrow(input, 0, begin, n);
          return cross_entropy(net.forward(x.dtype() == pd ? x : cast(x, pd)), narrow(target, 0, begin, n));
        };
      }
      trainer.step(w.batch, loss);
      meter.end_step();
    }
    out = StepMemory::of(meter);
  }
  streams.rewind();
  return out;
}

}  // namespace mg
