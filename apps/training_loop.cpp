// The shared training loop (see training_loop.h). One step: the next batch -> the Trainer's
// micro-batches (forward, backward, under the run's techniques) -> clip -> optimizer step at the
// schedule's lr -> the task's evaluation when due -> metrics.csv, progress, checkpoint. Everything
// random derives from the seed, and a checkpoint holds the weights, the optimizer state, the
// loader's position, the dropout stream and the Trainer's state, so a resumed run's losses equal
// an uninterrupted run's bit for bit.
#include "apps/training_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "apps/ddp_setup.h"
#include "apps/device_peaks_file.h"
#include "apps/interrupt_guard.h"
#include "apps/prune_run.h"
#include "apps/run_plan.h"
#include "apps/run_setup.h"
#include "core/allocator.h"
#include "core/error.h"
#include "ops/ops.h"
#include "optim/adamw8bit.h"
#include "optim/optim.h"
#include "optim/trainer.h"

namespace mg {

OptimizerKind parse_optimizer_kind(const std::string& s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "adamw8bit") return OptimizerKind::adamw8bit;
  if (s == "sgd") return OptimizerKind::sgd;
  MG_THROW("unknown optimizer '", s, "'; expected adamw, adamw8bit or sgd");
}

std::string optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::adamw8bit: return "adamw8bit";
    case OptimizerKind::sgd: return "sgd";
  }
  return "?";
}

void TrainOptions::validate(const std::string& cmd) const {
  MG_CHECK(batch > 0, cmd, ": --batch must be positive, got ", batch);
  MG_CHECK(lr > 0 && std::isfinite(lr), cmd, ": --lr must be a positive number, got ", lr);
  MG_CHECK(weight_decay >= 0 && std::isfinite(weight_decay), cmd, ": --weight-decay must be >= 0, got ", weight_decay);
  MG_CHECK(momentum >= 0 && momentum < 1, cmd, ": --momentum must be in [0, 1), got ", momentum);
  MG_CHECK(grad_clip >= 0 && std::isfinite(grad_clip), cmd, ": --grad-clip must be >= 0, got ", grad_clip);
  MG_CHECK(checkpoint_every >= 0, cmd, ": --checkpoint-every must be >= 0, got ", checkpoint_every);
  parse_memory_limits(memory_limit, budgeted_devices());
}

std::vector<Device> TrainOptions::budgeted_devices() const {
  if (parallel.active()) return parallel.model_devices();
  std::vector<Device> out{Device(device)};
  for (const Device& d : parallel.devices)  // --devices for --plan to split over
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

LrSchedule TrainOptions::schedule(int64_t total_steps) const {
  return LrSchedule::cosine(lr, warmup >= 0 ? warmup : total_steps / 20, total_steps, lr * min_lr_ratio);
}

nlohmann::json TrainOptions::to_config(const LrSchedule& sched) const {
  nlohmann::json opt = {{"type", optimizer_kind_name(optimizer)}, {"lr", lr}, {"weight_decay", weight_decay},
                        {"weight_decay_on", "parameters of rank >= 2"}, {"grad_clip", grad_clip}};
  if (optimizer == OptimizerKind::sgd) opt["momentum"] = momentum;
  return {{"optimizer", opt},
          {"schedule", {{"kind", "cosine"}, {"warmup_steps", sched.warmup_steps},
                        {"total_steps", sched.total_steps}, {"min_lr", sched.min_lr}}},
          {"seed", seed}, {"batch", batch}, {"checkpoint_every", checkpoint_every}, {"device", device},
          {"techniques", techniques.to_json()}, {"model_parallel", parallel.to_json()},
          {"data_parallel", data_parallel.to_json()}};
}

LrSchedule TrainOptions::read_config(const nlohmann::json& c, const std::string& cmd) {
  try {
    const auto& opt = c.at("optimizer");
    // Runs from before --optimizer name it "AdamW".
    const std::string type = opt.value("type", "adamw");
    optimizer = type == "AdamW" ? OptimizerKind::adamw : parse_optimizer_kind(type);
    lr = opt.at("lr");
    weight_decay = opt.at("weight_decay");
    grad_clip = opt.value("grad_clip", 0.0);
    momentum = opt.value("momentum", momentum);
    const auto& s = c.at("schedule");
    seed = c.at("seed");
    batch = c.at("batch");
    checkpoint_every = c.at("checkpoint_every");
    techniques = techniques.from_config(c);
    const bool print_schedule = parallel.print_schedule;  // a setting of this process
    parallel = ModelParallelOptions::from_json(c.value("model_parallel", nlohmann::json()));
    parallel.print_schedule = print_schedule && parallel.pipeline;
    return LrSchedule::cosine(lr, s.at("warmup_steps"), s.at("total_steps"), s.at("min_lr"));
  } catch (const nlohmann::json::exception& e) {
    MG_THROW(cmd, ": config.json of '", resume, "' is incomplete or malformed: ", e.what());
  } catch (const Error& e) {
    MG_THROW(cmd, ": config.json of '", resume, "' holds a bad value: ", e.what());
  }
}

std::unique_ptr<Optimizer> make_optimizer(const TrainOptions& o, Module& model, const DistributedDataParallel* ddp) {
  std::vector<ParamGroup> groups = weight_decay_groups(model.named_parameters(), o.lr, o.weight_decay);
  if (ddp) groups = ddp->optimizer_groups(groups);
  if (o.optimizer == OptimizerKind::sgd) return std::make_unique<SGD>(std::move(groups), SgdOptions{.momentum = o.momentum});
  if (o.optimizer == OptimizerKind::adamw8bit) return std::make_unique<AdamW8bit>(std::move(groups));
  return std::make_unique<AdamW>(std::move(groups));
}

TrainResult train_loop(const TrainingSetup& setup, const TrainingTask& task) {
  const TrainOptions& o = setup.options;
  RunDir& run = setup.run;
  DataLoader& loader = setup.loader;
  const LrSchedule& sched = setup.schedule;
  const std::unique_ptr<DistributedDataParallel> ddp = make_data_parallel(o, setup.model);  // null without --ddp
  std::unique_ptr<Optimizer> opt = make_optimizer(o, setup.model, ddp.get());
  TrainerOptions trainer_options = o.techniques.trainer_options(o.grad_clip);
  trainer_options.sync = ddp.get();
  // The run's techniques: the flags' (or --plan's), until --auto-fit's planner switches them.
  TechniqueOptions techniques = o.techniques;
  bool switched = false;  // a checkpoint then records the switched techniques
  std::vector<std::string> switch_notes;
  auto switch_to = [&](Trainer& t, const TechniqueOptions& next) {
    MG_INTERNAL_ASSERT(bool(task.set_checkpoint), task.command, ": the task cannot switch checkpoint policies");
    task.set_checkpoint(next.checkpoint);
    t.set_techniques(next.precision, next.offload_activations, next.micro_batch);
    techniques.checkpoint = next.checkpoint;
    techniques.precision = next.precision;
    techniques.offload_activations = next.offload_activations;
    techniques.micro_batch = next.micro_batch;
    switched = true;
  };
  if (setup.auto_fit)
    trainer_options.refit = [&](Trainer& t, const OutOfMemoryError&, int64_t micro) {
      const std::optional<RunPlan> next = setup.auto_fit->next(techniques, micro);
      if (!next) return false;  // the Trainer halves the micro-batch
      switch_to(t, next->techniques);
      switch_notes.push_back(next->str());
      return true;
    };
  Trainer trainer(setup.model, *opt, trainer_options);
  // The Trainer's state, and the techniques when auto-fit switched them (a resumed run restores them).
  auto trainer_state = [&] {
    nlohmann::json j = trainer.state();
    if (switched) {
      TechniqueOptions now = techniques;
      now.micro_batch = trainer.micro_batch();
      j["techniques"] = now.to_json();
    }
    return j;
  };

  TrainingState state;
  if (setup.resuming) {
    state = load_run_checkpoint(run, setup.model, *opt, ddp.get());  // --zero: this rank's shard
    MG_CHECK(state.generators.count("dropout"), task.command, ": the checkpoint of '", run.path(),
             "' has no dropout generator state");
    state.generators.at("dropout").restore(dropout_generator());
    loader.set_position(state.position);
    if (state.trainer.contains("techniques"))  // auto-fit had switched plans before this checkpoint
      switch_to(trainer, o.techniques.from_config({{"techniques", state.trainer["techniques"]}}));
    if (!state.trainer.empty()) trainer.load_state(state.trainer);
  } else {
    dropout_generator().manual_seed(setup.dropout_seed);
  }
  // A run pruned by magnitude (memgrad prune) keeps its pruned weights at zero after every step.
  const auto prune_masks = setup.resuming ? attach_prune_masks(run, setup.model, *opt, state.step) : nullptr;
  std::vector<std::string> columns = {"step", "loss", task.eval_column, "lr", "time_s", "peak_bytes"};
  if (setup.parallel)  // a split model: each device's step peak too
    for (const Device& d : setup.parallel->devices) columns.push_back("peak_bytes@" + d.str());
  const auto [metrics_path, metrics_from] = metrics_file(o, run, setup.resuming ? state.step : -1);  // --ddp: rank 0's
  MetricsWriter metrics(metrics_path, columns, metrics_from);

  TrainResult r;
  r.run_dir = run.path();
  r.first_step = state.step;
  r.num_parameters = setup.model.num_parameters();
  Progress progress(task.command, setup.total_steps, task.unit, o.progress);
  for (const std::string& line : task.notes) progress.note(line);
  if (setup.parallel)
    for (const std::string& line : setup.parallel->notes) progress.note(line);
  progress.note(task.command + ": " + task.header + ", " + optimizer_kind_name(o.optimizer) + " " + sched.str() +
                ", techniques: " + techniques.str() + ", on " + (setup.parallel ? o.parallel.str() : setup.device.str()) +
                (setup.resuming ? ", resuming at step " + std::to_string(state.step) : "") + " -> " + run.path());
  if (ddp) progress.note(task.command + ": " + ddp->str());

  // One meter per device the model lives on; the first device's carries the run's peak across
  // resumes. `highest()` is the one whose peak is highest (the progress line's and bench's figures).
  const std::vector<Device> devices = setup.parallel ? setup.parallel->devices : std::vector<Device>{setup.device};
  std::vector<PeakMeter> meters;
  for (const Device& d : devices) meters.emplace_back(d, meters.empty() ? state.peak_bytes : 0);
  auto highest = [&]() -> const PeakMeter& {
    return *std::max_element(meters.begin(), meters.end(),
                             [](const PeakMeter& a, const PeakMeter& b) { return a.run_peak() < b.run_peak(); });
  };
  auto run_peak = [&] { return highest().run_peak(); };
  StepTimes times, comm_times, exposed_times;  // the latter two: --ddp's collectives
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return state.elapsed_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  auto checkpoint = [&](int64_t step) {
    if (!o.save_checkpoints) return;
    save_run_checkpoint(run, setup.model, *opt, ddp.get(),  // --ddp: rank 0 writes
                        {.step = step, .position = loader.position(),
                         .generators = {{"dropout", GeneratorState::of(dropout_generator())}},
                         .elapsed_s = elapsed(), .peak_bytes = run_peak(), .trainer = trainer_state()});
  };
  setup.model.train();
  InterruptGuard interrupt;
  StepProfiler step_profiler(o.techniques, devices, state.step, setup.total_steps);
  int64_t step = state.step;
  while (step < setup.total_steps) {
    if (o.stop_after >= 0 && step >= o.stop_after) break;
    const double lr = sched(step);
    if (step_profiler.profiles(step)) {  // memory.html names these by their paths
      NamedTensors named = setup.model.named_parameters();
      for (auto& b : setup.model.named_buffers()) named.push_back(std::move(b));
      for (auto& s : opt->state_dict()) named.push_back(std::move(s));
      step_profiler.name_tensors(named);
    }
    step_profiler.before_step(step);
    times.start();
    for (PeakMeter& m : meters) m.begin_step();
    Batch batch = loader.next_step();
    opt->set_lr(lr);
    Trainer::MicroWeight weight;
    if (task.micro_weight)
      weight = [&](int64_t b, int64_t n) { return task.micro_weight(batch, b, n); };
    StepReport rep;
    try {
      if (setup.parallel && setup.parallel->schedule) {  // --pipeline: the schedule drives the micro-batches
        const PipelineStages stages = task.pipeline_stages(batch, setup.parallel->stage_blocks, trainer.micro_batch());
        rep = trainer.step_scheduled(
            batch.size(),
            [&](const std::vector<double>& w, double scale) {
              return run_pipeline(*setup.parallel->schedule, stages, w, scale);
            },
            weight);
      } else {
        rep = trainer.step(batch.size(), [&](int64_t b, int64_t n) { return task.micro_loss(batch, b, n); }, weight);
      }
    } catch (const OutOfMemoryError& e) {  // a split model: say which modules live on the full device
      if (setup.parallel) throw with_placement(e, setup.parallel->placement);
      throw;
    }
    r.offloaded_bytes = std::max(r.offloaded_bytes, rep.offloaded_bytes);
    if (ddp) comm_times.add(ddp->comm_seconds()), exposed_times.add(ddp->exposed_comm_seconds());
    for (const std::string& plan : switch_notes)
      progress.note("auto-fit: step " + std::to_string(step + 1) + " ran out of memory; switched to " + plan +
                    " and retried the same batch");
    if (rep.retries > int64_t(switch_notes.size()))
      progress.note("auto-fit: step " + std::to_string(step + 1) + " ran out of memory; retried with micro-batch " +
                    std::to_string(rep.micro_batch) + " (" + std::to_string(rep.micro_steps) + " micro-steps)");
    switch_notes.clear();
    std::vector<int64_t> device_step_peaks;
    for (PeakMeter& m : meters) device_step_peaks.push_back(m.end_step());
    const int64_t step_peak = *std::max_element(device_step_peaks.begin(), device_step_peaks.end());
    const double secs = times.stop();
    if (std::string line = step_profiler.after_step(step, run.path()); !line.empty()) progress.note(line);
    ++step;

    const std::optional<Evaluation> eval = task.evaluate(step, trainer.micro_batch());
    std::vector<std::string> row = {csv_number(step - 1), csv_number(rep.loss),
                                    eval ? csv_number(eval->value) : std::string(), csv_number(lr),
                                    csv_number(elapsed()), csv_number(step_peak)};
    if (setup.parallel)
      for (int64_t p : device_step_peaks) row.push_back(csv_number(p));
    metrics.write(row);
    r.last_loss = rep.loss;
    std::string extra = task.progress_extra(step, lr);
    if (setup.parallel)  // every device's run peak: "cpu:0 41.2 MiB | cpu:1 39.8 MiB"
      for (size_t i = 0; i < meters.size(); ++i)
        extra += (i ? " | " : "  peaks ") + devices[i].str() + " " + format_bytes(meters[i].run_peak());
    const PeakMeter& top = highest();
    progress.update({.done = step, .loss = rep.loss,
                     .throughput = double(o.batch * task.items_per_example) / secs,  // the global batch
                     .allocated = top.allocated(), .peak = top.run_peak(), .limit = top.limit(), .extra = extra});
    if (eval && !eval->note.empty()) progress.note(eval->note);
    r.interrupted = interrupt.raised() && step < setup.total_steps;
    if (task.checkpoint_due(step) || step == setup.total_steps || r.interrupted) checkpoint(step);
    if (r.interrupted) break;
  }
  std::vector<DevicePeak> device_peaks;  // every device's steady peaks (one device: the run's)
  for (size_t i = 0; i < meters.size(); ++i) {
    DevicePeak p{.device = devices[i], .peak = meters[i].steady_peak(), .category = {},
                 .modules = setup.parallel ? setup.parallel->placement.modules_on(devices[i]) : "all"};
    for (MemoryCategory c : kAllMemoryCategories) p.category[size_t(c)] = meters[i].steady_category_peak(c);
    device_peaks.push_back(p);
  }
  if (!ddp && step > state.step)  // for `memgrad report --run` (--ddp ranks share the folder: not written)
    write_device_peaks(run.path(), {.measured = device_peaks,
                                    .predicted = setup.parallel ? setup.parallel->predicted : std::vector<DevicePeak>{},
                                    .steps = step - state.step});
  if (setup.parallel) {
    r.device_peaks = device_peaks;
    if (step > state.step) {
      std::string table = device_peaks_table(r.device_peaks, setup.parallel->predicted);
      while (!table.empty() && table.back() == '\n') table.pop_back();
      progress.note("per-device peaks (steps after the first):\n" + table);
    }
  }
  progress.finish();
  r.steps_done = step;
  r.ms_per_step = 1000.0 * times.median();
  r.items_per_s = times.count() ? double(o.batch * task.items_per_example) / times.median() : 0.0;
  r.peak_bytes = run_peak();
  if (comm_times.count()) r.comm_ms = 1000.0 * comm_times.median(), r.exposed_comm_ms = 1000.0 * exposed_times.median();
  r.memory = StepMemory::of(highest());
  r.micro_batch = trainer.micro_batch();
  r.skipped_steps = trainer.scaler() ? trainer.scaler()->skipped_steps() : 0;
  return r;
}

}  // namespace mg
