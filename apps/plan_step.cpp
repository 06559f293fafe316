// One measured training step of a workload on any device (see plan_step.h). It mirrors what the
// training commands run: the model built on the device (parameters), precision and checkpointing
// applied, the commands' optimizer, the loader's batches allocated before the step (inputs), and
// one Trainer step per measurement with the commands' micro-batch loss; a split model placed on
// its devices as the commands place it.
#include "apps/plan_step.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <deque>

#include "apps/ddp_setup.h"
#include "apps/model_parallel_run.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "optim/clip_grad.h"
#include "optim/trainer.h"
#include "parallel/placement.h"
#include "parallel/split.h"

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

// Sums the bytes allocated on the step's devices while alive.
struct AllocatedBytes : AllocatorObserver {
  AllocatedBytes(std::vector<Device> a, std::optional<Device> b) : a(std::move(a)), b(b) { add_allocator_observer(this); }
  ~AllocatedBytes() override { remove_allocator_observer(this); }
  void on_event(const MemoryEvent& e) override {
    if (e.kind == MemoryEvent::Kind::alloc && (std::find(a.begin(), a.end(), e.device) != a.end() || (b && e.device == *b)))
      bytes += int64_t(e.requested);
  }
  std::vector<Device> a;
  std::optional<Device> b;
  std::atomic<int64_t> bytes{0};
};

// Note [CPU time]: on a shared machine a step's wall-clock time includes every moment the OS gave
// its cores to other processes, which varies 2-10x between runs minutes apart. The process's CPU
// time counts only what its own threads ran, so it stays comparable across candidates timed at
// different moments. With one thread it is the step time of an idle machine; with more it is
// their sum (spin-waits included), a cost rather than a latency.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Puts a device's budget back when the measurement ends (normally or by an exception).
struct LimitGuard {
  LimitGuard(Device d, int64_t limit) : d(d), saved(memory_limit(d)) {
    if (limit > 0) set_memory_limit(d, size_t(limit));
  }
  ~LimitGuard() { set_memory_limit(d, saved); }
  Device d;
  size_t saved;
};

std::shared_ptr<Module> build(const PlanWorkload& w, const Device& d) {
  Generator gen(0);  // its own stream: measuring never moves the user's
  if (w.is_gpt()) return std::make_shared<GPT>(*w.gpt, InitOptions{.gen = &gen, .device = d});
  return std::make_shared<MobileNetV2>(*w.mobilenet, InitOptions{.gen = &gen, .device = d});
}

// What --split balanced measures on meta to choose its cuts: one micro-batch of this workload
// under these techniques and optimizer, as the training commands' probes (gpt_train, vision_train).
StepProbe probe_of(const PlanWorkload& w, const TechniqueOptions& t, const TrainOptions& o) {
  const int64_t rows = t.micro_batch > 0 ? t.micro_batch : w.batch;
  auto optimizer = [o](Module& m) { return make_optimizer(o, m); };
  if (w.is_gpt()) return with_run_techniques<GPT>(gpt_step_probe(*w.gpt, rows, w.gpt->context, optimizer), t);
  return with_run_techniques<MobileNetV2>(mobilenet_step_probe(*w.mobilenet, rows, w.mobilenet->input_size, optimizer), t);
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

StepMeasurement measure_step(const PlanWorkload& w, const TechniqueOptions& t, const Device& device, int steps,
                             const MemoryLimits& memory_limits, const ModelParallelOptions& parallel,
                             const DataParallelOptions& data_parallel) {
  MG_CHECK(w.gpt.has_value() != w.mobilenet.has_value(), "measure_step: a workload is one GPT or one MobileNetV2");
  MG_CHECK(w.batch > 0 && (steps >= 2 || steps == kUntilSteady), "measure_step: needs a batch (got ", w.batch,
           ") and 2+ steps (got ", steps, ")");
  MG_CHECK(!parallel.pipeline, "measure_step: a pipelined split is not measured here (its stages run on worker threads)");
  MG_CHECK(!(parallel.active() && t.offload_activations), "measure_step: a split model does not offload activations");
  t.validate(w.batch, device);
  // Data parallel: this rank's rows of every batch, checked as prepare_data_parallel checks them.
  PlanWorkload rank_w = w;
  ProcessGroup* group = data_parallel.enabled ? data_parallel.group.get() : nullptr;
  if (data_parallel.enabled) {
    MG_CHECK(group, "measure_step: data parallelism needs a process group (real or simulated)");
    MG_CHECK(!parallel.active(), "measure_step: data parallelism does not combine with a split model (each rank "
             "trains a whole replica)");
    const int N = group->world_size();
    MG_CHECK(w.batch % N == 0, "measure_step: the batch of ", w.batch, " does not split evenly over ", N, " ranks");
    MG_CHECK(t.micro_batch <= w.batch / N, "measure_step: the micro-batch of ", t.micro_batch, " is larger than each "
             "rank's ", w.batch / N, " rows of the batch");
    rank_w.batch = w.batch / N;
  }
  TechniqueOptions tech = t;
  if (device.is_meta() && tech.offload_activations) tech.offload_activations = Device(DeviceType::meta, device.index + 1);
  StreamRecorder streams;  // dropout draws: put back at the end
  // The devices the step's memory lives on: the model's (a split: every device it is placed on).
  const std::vector<Device> devices = parallel.active() ? parallel.model_devices() : std::vector<Device>{device};
  for (const Device& d : devices) empty_cache(d);
  if (tech.offload_activations) empty_cache(*tech.offload_activations);
  StepMeasurement out;
  StepTimes times;
  // The streams go back on every exit, an OutOfMemoryError under `memory_limit` included (the
  // planner runs inside a training run's auto-fit retry, whose batch must draw the same dropout).
  struct Rewind {
    const StreamRecorder& s;
    ~Rewind() { s.rewind(); }
  } rewind{streams};
  {
    // Every device's budget is put back at the end; a split's budgets are set as a training
    // command sets them (place_model: a device before modules move onto it).
    std::deque<LimitGuard> limits;
    limits.emplace_back(device, parallel.active() ? 0 : limit_of(memory_limits, device));
    for (const Device& d : devices)
      if (d != device) limits.emplace_back(d, 0);
    std::shared_ptr<Module> model = build(w, device);
    apply_precision(*model, tech.precision);
    if (w.is_gpt()) static_cast<GPT&>(*model).set_checkpoint(tech.checkpoint);
    else static_cast<MobileNetV2&>(*model).set_checkpoint(tech.checkpoint);
    TrainOptions o;
    o.optimizer = w.optimizer;
    o.momentum = w.momentum;
    const std::optional<ModelParallelRun> placed =
        place_model(parallel, *model, probe_of(w, tech, o), memory_limits_spec(memory_limits),
                    w.batch, tech.micro_batch);
    const Device input_device = placed ? placed->input_device() : device;
    const Device label_device = placed ? placed->output_device() : device;
    o.data_parallel = data_parallel;
    const std::unique_ptr<DistributedDataParallel> ddp = make_data_parallel(o, *model);  // null without
    std::unique_ptr<Optimizer> opt = make_optimizer(o, *model, ddp.get());
    TrainerOptions trainer_options = tech.trainer_options(w.grad_clip);
    trainer_options.sync = ddp.get();
    Trainer trainer(*model, *opt, trainer_options);
    std::vector<PeakMeter> meters;
    for (const Device& d : devices) meters.emplace_back(d);
    // Note [Steady state]: a block reused from the cache may be larger than asked, so the first
    // steps' peaks can differ by a block while the pool settles; kUntilSteady runs until two
    // steps after the first peak alike on every device (at most kMaxSteadySteps).
    std::vector<std::pair<int64_t, int64_t>> previous(devices.size(), {-1, -1});  // peak, reserved
    const int max_steps = steps == kUntilSteady ? kMaxSteadySteps : steps;
    for (int s = 0; s < max_steps; ++s) {
      const ProcessGroup::Traffic traffic0 = group ? group->traffic() : ProcessGroup::Traffic{};
      // Only meta's step is an estimate's input; on a real device the counter's bookkeeping (a
      // lock and a map insert per new tensor) would be timed with the step.
      std::optional<FlopCounter> flops;
      if (device.is_meta()) flops.emplace();
      AllocatedBytes bytes(devices, tech.offload_activations);
      times.start();
      const double cpu0 = process_cpu_seconds();
      for (PeakMeter& m : meters) m.begin_step();
      Batches b = make_batches(rank_w, input_device);
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
          const Tensor y = to(narrow(target, 0, begin, n), label_device);
          return cross_entropy(net.forward(x.dtype() == pd ? x : cast(x, pd)), y);
        };
      }
      try {
        trainer.step(rank_w.batch, loss);
      } catch (const OutOfMemoryError& e) {  // a split model: say which modules live on the full device
        if (placed) throw with_placement(e, placed->placement);
        throw;
      }
      bool steady = steps == kUntilSteady && s >= 2;
      for (size_t i = 0; i < devices.size(); ++i) {
        const std::pair<int64_t, int64_t> now{meters[i].end_step(), memory_stats(devices[i]).reserved.peak};
        steady = steady && now == previous[i];
        previous[i] = now;
      }
      const double seconds = times.stop();
      if (s > 0) out.timed_ms.push_back(1e3 * seconds);
      if (s > 0) out.timed_cpu_ms.push_back(1e3 * (process_cpu_seconds() - cpu0));
      if (flops) out.flops = flops->counts();
      out.allocated_bytes = bytes.bytes;
      if (group) {
        const ProcessGroup::Traffic now = group->traffic();
        out.traffic = {.all_reduce = now.all_reduce - traffic0.all_reduce,
                       .reduce_scatter = now.reduce_scatter - traffic0.reduce_scatter,
                       .all_gather = now.all_gather - traffic0.all_gather,
                       .broadcast = now.broadcast - traffic0.broadcast};
      }
      if (steady) break;
    }
    for (size_t i = 0; i < devices.size(); ++i)
      out.devices.push_back({.device = devices[i], .memory = StepMemory::of(meters[i]),
                             .modules = placed ? placed->placement.modules_on(devices[i]) : "all"});
    out.memory = std::max_element(out.devices.begin(), out.devices.end(), [](const auto& a, const auto& b) {
                   return a.memory.peak < b.memory.peak;
                 })->memory;
    out.ms_per_step = 1e3 * times.median();
  }
  return out;
}

double measure_update_ms(const PlanWorkload& w, Precision precision, const Device& device, bool cpu_time,
                         int reps) {
  MG_CHECK(reps >= 1, "measure_update_ms: needs 1+ repetitions, got ", reps);
  empty_cache(device);
  std::shared_ptr<Module> model = build(w, device);
  apply_precision(*model, precision);
  TrainOptions o;
  o.optimizer = w.optimizer;
  o.momentum = w.momentum;
  std::unique_ptr<Optimizer> opt = make_optimizer(o, *model);
  std::vector<Tensor> params;
  {
    MemoryCategoryGuard tag(MemoryCategory::gradient);
    for (const auto& g : opt->param_groups())
      for (const auto& [name, p] : g.params) {
        p.set_grad(zeros(p.shape(), {.dtype = p.dtype(), .device = device}));
        params.push_back(p);
      }
  }
  StepTimes times;
  for (int r = 0; r <= reps; ++r) {  // the first is warm-up (the optimizer's state is allocated)
    times.start();
    const double cpu0 = process_cpu_seconds();
    if (w.grad_clip > 0) clip_grad_norm(params, w.grad_clip);
    opt->step();
    if (cpu_time) times.add(process_cpu_seconds() - cpu0);
    else times.stop();
  }
  return 1e3 * times.median();
}

}  // namespace mg
