// `memgrad prune` (see prune_run.h). The source run's model and optimizer are loaded on the host,
// pruned, and written as a new run directory with the same layout: config.json (the model's new
// widths, and a "pruning" record), metrics.csv (the history so far) and checkpoint/ (the pruned
// model, its optimizer state, the source's training state), so `--resume` continues the run.
#include "apps/prune_run.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "apps/gpt_train.h"
#include "apps/run_setup.h"
#include "apps/training_loop.h"
#include "apps/vision_train.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "data/token_window_dataset.h"
#include "models/compress/distillation.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"
#include "models/compress/structured_prune.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "optim/precision.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCmd = "prune";
constexpr const char* kMasksFile = "masks.safetensors";
constexpr const char* kSparseFile = "model.sparse.safetensors";
constexpr const char* kTwoFour = "2:4";
const Device kHost("cpu:0");

int64_t parameter_bytes() { return memory_stats(kHost).category(MemoryCategory::parameter).current; }

// The run's optimizer (type, lr, weight decay from its config.json) over `model`.
std::unique_ptr<Optimizer> run_optimizer(Module& model, const nlohmann::json& config) {
  TrainOptions t;
  t.read_config(config, kCmd);
  return make_optimizer(t, model);
}

// The loss of the first `batches` training batches, one per call (taylor's data).
std::function<Tensor()> gpt_batches(const RunDir& run, const nlohmann::json& config, GPT& model,
                                    std::shared_ptr<DataLoader>& keep) {
  std::string tf = config.at("data").at("token_file").get<std::string>();
  if (!fs::path(tf).is_absolute()) tf = run.file(tf);
  MG_CHECK(fs::exists(tf), kCmd, ": the taylor criterion needs the run's training data, and its token file '", tf,
           "' is missing\n  hint: choose l1 or l2, which need no data");
  auto file = std::make_shared<const TokenFile>(tf);
  auto [train, val] = split_train_val(file->size(), config.at("data").value("val_fraction", 0.1));
  auto set = std::make_shared<TokenWindowDataset>(
      file, TokenWindowOptions{.context = model.config().context, .region = train, .seed = 1});
  keep = std::make_shared<DataLoader>(set, DataLoaderOptions{.batch_size = config.at("batch").get<int64_t>(),
                                                             .drop_last = true, .prefetch = 0, .device = kHost});
  return [&model, keep] {
    Batch b = keep->next_step();
    return model.loss(b.input, b.target);
  };
}

std::function<Tensor()> vision_batches(const nlohmann::json& config, MobileNetV2& model, std::shared_ptr<DataLoader>& keep) {
  const auto& d = config.at("data");
  VisionData data = load_vision_data(d.at("source").get<std::string>(), model.config().input_size, false, 1,
                                     d.value("limit_train", int64_t(0)), 1);
  keep = std::make_shared<DataLoader>(data.train, DataLoaderOptions{.batch_size = config.at("batch").get<int64_t>(),
                                                                    .drop_last = true, .prefetch = 0, .device = kHost});
  return [&model, keep] {
    Batch b = keep->next_step();
    const DType dt = model.features->parameters()[0].dtype();
    return cross_entropy(model.forward(b.input.dtype() == dt ? b.input : cast(b.input, dt)), b.target);
  };
}

std::vector<PruneGroup> groups_of(const GPT& m, const PruneOptions& o) {
  const std::string t = o.target.empty() ? "mlp" : o.target;
  MG_CHECK(t == "mlp" || t == "heads" || t == "mlp+heads", kCmd, ": --target must be mlp, heads or mlp+heads for "
           "GPT, got '", t, "'");
  return gpt_groups(m.config(), t != "heads", t != "mlp");
}
std::vector<PruneGroup> groups_of(const MobileNetV2& m, const PruneOptions& o) {
  MG_CHECK(o.target.empty() || o.target == "expansion", kCmd, ": MobileNetV2 prunes expansion channels; --target '",
           o.target, "' is for GPT");
  return mobilenet_v2_groups(m.config());
}

// Writes an unstructured run's masks.safetensors and model.sparse.safetensors from `model` (the
// masked weights) and records their names, bytes and sparsity in `record` and `r`.
void write_sparse_files(Module& model, const MagnitudeMask& mask, const RunDir& dst, nlohmann::json& record,
                        PruneResult& r) {
  r.sparsity = mask.sparsity();
  r.mask_bytes = mask.mask_bytes();
  const bool two_four = record.value("method", "") == kTwoFour;
  const SparseLayout layout = two_four ? SparseLayout::two_four : SparseLayout::bitmask;
  NamedTensors weights = two_four ? prunable_24_weights(model) : prunable_weights(model);
  r.dense_weight_bytes = 0;
  for (const auto& [_, w] : weights) r.dense_weight_bytes += int64_t(w.nbytes());
  dst.create();
  save_safetensors(dst.file(kMasksFile), mask.masks_state(), {{"format", "memgrad-magnitude-masks"}});
  const std::string tmp = dst.file("weights.sparse.tmp");
  r.sparse_weight_bytes = save_sparse_safetensors(tmp, weights, layout);  // the masked weights alone, for the count
  fs::remove(tmp);
  r.stored_bytes = save_sparse_safetensors(dst.file(kSparseFile), model.state_dict(), layout);
  record["masks"] = kMasksFile;
  record["sparse_weights"] = kSparseFile;
  record["sparse_bytes"] = r.stored_bytes;
  record["sparsity"] = r.sparsity;
}

// After fine-tuning an unstructured or 2:4 run: its masks and sparse file again from the
// checkpoint's weights (gradual pruning raised the sparsity; every schedule changed the kept
// weights). 2:4 masks stay those of masks.safetensors (a subset of the weights).
template <typename M>
void refresh_sparse_files(const RunDir& dst, PruneResult& r) {
  nlohmann::json config = dst.read_config();
  Generator scratch(0);
  M model(std::decay_t<decltype(std::declval<M>().config())>::from_json(config.at("model")),
          {.gen = &scratch, .device = kHost});
  apply_precision(model, TechniqueOptions{}.from_config(config).precision);
  dst.load_weights(model);
  const bool two_four = config["pruning"].value("method", "") == kTwoFour;
  const PruneScope scope = parse_prune_scope(config["pruning"].value("scope", "layer"));
  const MagnitudeMask mask = two_four ? MagnitudeMask(model, load_safetensors(dst.file(kMasksFile)))
                                      : MagnitudeMask(model, 0.0, scope);  // the zeros as they are
  write_sparse_files(model, mask, dst, config["pruning"], r);
  dst.write_config(config);
}

// Loads the run's model and optimizer, prunes, writes the new run. Returns the pruned config.
template <typename M>
nlohmann::json prune_into(const RunDir& src, const RunDir& dst, nlohmann::json config, const PruneOptions& o,
                          PruneResult& r) {
  using Config = std::decay_t<decltype(std::declval<M>().config())>;
  const Config cfg = Config::from_json(config.at("model"));
  const Precision precision = TechniqueOptions{}.from_config(config).precision;
  const int64_t bytes0 = parameter_bytes();
  Generator scratch(0);  // every value comes from the checkpoint
  M model(cfg, {.gen = &scratch, .device = kHost});
  apply_precision(model, precision);
  std::unique_ptr<Optimizer> opt = run_optimizer(model, config);
  TrainingState state = src.load_checkpoint(model, opt.get());
  r.parameters_before = model.num_parameters();
  r.parameter_bytes_before = parameter_bytes() - bytes0;
  state.peak_bytes = 0;  // the pruned run measures its own peak

  nlohmann::json record = {{"from", fs::absolute(src.path()).lexically_normal().string()}, {"method", o.method},
                           {"amount", o.amount}, {"scope", o.scope}, {"at_step", state.step}};
  if (o.method == "structured") {
    const PruneCriterion criterion = parse_prune_criterion(o.criterion);
    std::vector<PruneGroup> groups = groups_of(model, o);
    GroupScores taylor;
    if (criterion == PruneCriterion::taylor) {
      std::shared_ptr<DataLoader> loader;
      std::function<Tensor()> loss;
      if constexpr (std::is_same_v<M, GPT>) loss = gpt_batches(src, config, model, loader);
      else loss = vision_batches(config, model, loader);
      model.eval();  // BatchNorm's running statistics must not move while scoring
      taylor = taylor_importance(model, groups, o.taylor_batches, loss);
      model.train();
    }
    const PrunePlan plan = plan_pruning(model, groups, o.amount, criterion, parse_prune_scope(o.scope),
                                        criterion == PruneCriterion::taylor ? &taylor : nullptr);
    const int64_t bytes1 = parameter_bytes();
    std::unique_ptr<M> pruned = prune_model(model, plan);
    r.parameters_after = pruned->num_parameters();
    r.parameter_bytes_after = parameter_bytes() - bytes1;
    std::unique_ptr<Optimizer> popt = run_optimizer(*pruned, config);
    {
      MemoryCategoryGuard guard(MemoryCategory::optimizer_state);
      popt->load_state_dict(apply_plan_to_optimizer_state(plan, opt->state_dict()), opt->state_metadata());
    }
    record["criterion"] = o.criterion;
    record["target"] = o.target.empty() ? (std::is_same_v<M, GPT> ? "mlp" : "expansion") : o.target;
    config["model"] = pruned->config().to_json();
    config["pruning"] = record;
    dst.write_config(config);
    dst.save_checkpoint(*pruned, *popt, state);
  } else if (o.method == kTwoFour) {
    MagnitudeMask mask = MagnitudeMask::two_four(model);
    r.parameters_after = r.parameters_before;
    r.parameter_bytes_after = r.parameter_bytes_before;  // dense while training (the masks keep the zeros)
    record["criterion"] = "l1";
    record["pattern"] = kTwoFour;
    write_sparse_files(model, mask, dst, record, r);
    config["pruning"] = record;
    dst.write_config(config);
    dst.save_checkpoint(model, *opt, state);
  } else {
    const PruneScope scope = parse_prune_scope(o.scope);
    double amount = o.amount;
    if (o.schedule == "gradual") {  // the masks start at the schedule's initial sparsity and rise while fine-tuning
      const GradualSchedule sched = default_gradual_schedule(o.amount, state.step, o.finetune_steps);
      record["schedule"] = sched.to_json();
      amount = sched.initial;
    }
    MagnitudeMask mask(model, amount, scope);
    r.parameters_after = r.parameters_before;
    r.parameter_bytes_after = r.parameter_bytes_before;  // dense in memory: zeros take bytes too
    record["criterion"] = "l1";
    write_sparse_files(model, mask, dst, record, r);
    config["pruning"] = record;
    dst.write_config(config);
    dst.save_checkpoint(model, *opt, state);
  }
  return config;
}

// A run's quality: validation loss (gpt, the run's validation windows) or test accuracy (vision).
double quality(const RunDir& run, bool gpt) {
  return gpt ? gpt_eval({.run = run.path()}).loss : vision_eval({.run = run.path()}).accuracy;
}

// --finetune-lr: the fine-tune gets its own cosine, from `lr` at the pruned step `at` down to the
// run's min/peak ratio at `end`, written into the run's schedule as a cosine whose warmup ends at
// `at` (steps the run has passed). Without it the run's schedule stretches to end at `end`.
void restart_schedule(nlohmann::json& config, int64_t at, int64_t end, double lr) {
  auto& opt = config.at("optimizer");
  auto& s = config.at("schedule");
  MG_CHECK(s.value("kind", "") == "cosine", kCmd, ": --finetune-lr restarts a cosine schedule; the run's is '",
           s.value("kind", "?"), "'");
  const double ratio = s.at("min_lr").get<double>() / opt.at("lr").get<double>();
  opt["lr"] = lr;
  s["min_lr"] = lr * ratio;
  s["warmup_steps"] = at;
  s["total_steps"] = end;
}

BenchRow bench_one(int64_t steps, const nlohmann::json& config, const std::string& dir, bool gpt) {
  BenchOptions b;
  if (gpt) b.gpt = GPTConfig::from_json(config.at("model"));
  else b.mobilenet = MobileNetV2Config::from_json(config.at("model"));
  b.techniques = "none";
  b.steps = steps;
  b.batch = config.at("batch").get<int64_t>();
  b.data = config.at("data").at("source").get<std::string>();
  b.out = dir;
  b.progress = ProgressStyle::none;
  fs::remove_all(dir);
  return run_bench(b).rows.at(0);
}

}  // namespace

PruneResult prune_run(const PruneOptions& o) {
  MG_CHECK(o.method == "structured" || o.method == "unstructured" || o.method == kTwoFour, kCmd,
           ": --method must be structured, unstructured or 2:4, got '", o.method, "'");
  if (o.method != "structured")
    MG_CHECK(o.criterion == "l1", kCmd, ": --method ", o.method, " ranks single weights by magnitude (l1); --criterion ",
             o.criterion, " applies to --method structured");
  if (o.method == kTwoFour)
    MG_CHECK(o.amount == 0.5 && o.schedule == "oneshot", kCmd, ": --method 2:4 removes 2 of every 4 weights (exactly "
             "half), in one shot; leave --amount at 0.5 and --schedule at oneshot");
  MG_CHECK(o.amount >= 0.0 && o.amount < 1.0, kCmd, ": --amount must be in [0, 1) (the fraction removed), got ",
           o.amount);
  parse_prune_scope(o.scope);
  MG_CHECK(o.schedule == "oneshot" || o.schedule == "gradual", kCmd, ": --schedule must be oneshot or gradual, got '",
           o.schedule, "'");
  MG_CHECK(o.schedule == "oneshot" || o.method == "unstructured", kCmd, ": --schedule gradual raises the sparsity of "
           "magnitude masks; use it with --method unstructured");
  if (o.schedule == "gradual")
    MG_CHECK(o.finetune_steps >= 2, kCmd, ": --schedule gradual prunes during fine-tuning; give --finetune-steps >= 2");
  MG_CHECK(o.finetune_lr >= 0.0, kCmd, ": --finetune-lr must be >= 0 (0: the run's schedule continues), got ",
           o.finetune_lr);
  if (o.distill != 0.0) {
    DistillationOptions{.weight = o.distill, .temperature = o.distill_temperature}.validate(kCmd);
    MG_CHECK(o.finetune_steps > 0, kCmd, ": --distill shapes the fine-tune; give --finetune-steps > 0");
  }
  MG_CHECK(o.finetune_steps >= 0 && o.bench_steps >= 0, kCmd, ": --finetune-steps and --bench-steps must be >= 0");
  MG_CHECK(!o.out.empty(), kCmd, ": --out is required (the new run directory)");
  RunDir src = existing_run_dir(o.run, kCmd);
  MG_CHECK(fs::weakly_canonical(o.out) != fs::weakly_canonical(o.run), kCmd, ": --out must differ from --run");
  RunDir dst = new_run_dir(o.out, "pruned", kCmd);
  nlohmann::json config = src.read_config();
  const std::string command = config.value("command", "");
  MG_CHECK(command == "gpt train" || command == "vision train", kCmd, ": '", o.run, "' is a '", command,
           "' run; prune reads gpt train and vision train runs");
  const bool gpt = command == "gpt train";
  MG_CHECK(!(gpt && o.distill != 0.0), kCmd, ": --distill fine-tunes vision runs (MobileNetV2); a GPT's fine-tune "
           "learns from its tokens only");
  PruneResult r;
  r.out_dir = dst.path();
  r.method = o.method;
  r.kind = gpt ? "gpt" : "vision";
  r.quality_before = r.quality_pruned = r.quality_finetuned = std::nan("");
  if (gpt) {  // the token file stays where it is (an absolute path), not copied
    std::string tf = config.at("data").at("token_file").get<std::string>();
    if (!fs::path(tf).is_absolute() && fs::exists(src.file(tf)))
      config["data"]["token_file"] = fs::absolute(src.file(tf)).lexically_normal().string();
  }
  try {
    config = gpt ? prune_into<GPT>(src, dst, config, o, r) : prune_into<MobileNetV2>(src, dst, config, o, r);
  } catch (const nlohmann::json::exception& e) {
    MG_THROW(kCmd, ": config.json of '", o.run, "' is incomplete or malformed: ", e.what());
  }
  if (fs::exists(src.metrics_path())) fs::copy_file(src.metrics_path(), dst.metrics_path(), fs::copy_options::overwrite_existing);

  // Quality: before, right after pruning, after fine-tuning.
  if (o.evaluate_source) r.quality_before = quality(src, gpt);
  r.quality_pruned = quality(dst, gpt);
  const int64_t at = dst.read_checkpoint_state().step;
  if (o.finetune_steps > 0) {
    if (o.distill > 0.0) {  // the teacher is the source run as it is (its checkpoint stays unchanged)
      config["distill"] = DistillationOptions{.weight = o.distill, .temperature = o.distill_temperature}.to_json();
      config["distill"]["teacher"] = fs::absolute(src.path()).lexically_normal().string();
      dst.write_config(config);
    }
    if (o.finetune_lr > 0.0) {
      restart_schedule(config, at, at + o.finetune_steps, o.finetune_lr);
      if (gpt) config["steps"] = at + o.finetune_steps;
      else config["epochs"] = std::max(config.at("epochs").get<int64_t>(),
                                       (at + o.finetune_steps + config.at("steps_per_epoch").get<int64_t>() - 1) /
                                           config.at("steps_per_epoch").get<int64_t>());
      dst.write_config(config);
    }
    if (gpt) {
      GptTrainOptions t;
      t.resume = dst.path();
      t.resume_steps = at + o.finetune_steps;
      t.progress = o.progress;
      r.finetune_steps = gpt_train(t).steps_done - at;
    } else {
      // vision_train counts in epochs: stretch the run to cover the steps, checkpoint exactly at
      // the last one and stop there; the run's own checkpoint interval is restored afterwards.
      const int64_t per_epoch = config.at("steps_per_epoch").get<int64_t>(), end = at + o.finetune_steps;
      const nlohmann::json every = config.at("checkpoint_every");
      config["checkpoint_every"] = end;
      dst.write_config(config);
      VisionTrainOptions t;
      t.resume = dst.path();
      t.progress = o.progress;
      t.resume_epochs = std::max(config.at("epochs").get<int64_t>(), (end + per_epoch - 1) / per_epoch);
      t.stop_after = end;
      VisionTrainResult v = vision_train(t);
      config = dst.read_config();
      config["checkpoint_every"] = every;
      dst.write_config(config);
      r.finetune_steps = v.steps_done - at;
    }
    if (o.method != "structured") gpt ? refresh_sparse_files<GPT>(dst, r) : refresh_sparse_files<MobileNetV2>(dst, r);
    r.quality_finetuned = quality(dst, gpt);
  }
  if (o.bench_steps > 0) {
    r.bench_before = bench_one(o.bench_steps, src.read_config(), dst.file("bench-unpruned"), gpt);
    r.bench_after = bench_one(o.bench_steps, config, dst.file("bench-pruned"), gpt);
  }
  return r;
}

std::string prune_report(const PruneResult& r) {
  auto mib = [](int64_t b) { return double(b) / 1048576.0; };
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof buf, "prune: %s -> %s\n  parameters      %12lld -> %12lld  (%.1f%% fewer)\n",
                r.kind.c_str(), r.out_dir.c_str(), (long long)r.parameters_before, (long long)r.parameters_after,
                100.0 * (1.0 - double(r.parameters_after) / double(r.parameters_before)));
  s += buf;
  std::snprintf(buf, sizeof buf, "  parameter bytes %9.2f MiB -> %9.2f MiB  (allocator, category parameter; %.1f%% less)\n",
                mib(r.parameter_bytes_before), mib(r.parameter_bytes_after),
                100.0 * (1.0 - double(r.parameter_bytes_after) / double(r.parameter_bytes_before)));
  s += buf;
  if (r.dense_weight_bytes > 0) {
    std::snprintf(buf, sizeof buf,
                  "  sparsity %.2f%% of the masked Linear/Conv2d weights; stored %.2f MiB dense -> %.2f MiB %s "
                  "(%.2fx smaller); masks %.2f MiB\n",
                  100.0 * r.sparsity, mib(r.dense_weight_bytes), mib(r.sparse_weight_bytes),
                  r.method == kTwoFour ? "2:4 values+indices" : "bitmask+values",
                  double(r.dense_weight_bytes) / double(r.sparse_weight_bytes), mib(r.mask_bytes));
    s += buf;
  }
  const char* q = r.kind == "gpt" ? "validation loss" : "test accuracy";
  auto qv = [&](double v) {
    if (std::isnan(v)) return std::string("-");
    std::snprintf(buf, sizeof buf, r.kind == "gpt" ? "%.4f" : "%.2f%%", r.kind == "gpt" ? v : 100.0 * v);
    return std::string(buf);
  };
  const std::string before = qv(r.quality_before), pruned = qv(r.quality_pruned), tuned = qv(r.quality_finetuned);
  std::snprintf(buf, sizeof buf, "  %s: before %s, pruned %s, after %lld fine-tune steps %s\n", q, before.c_str(),
                pruned.c_str(), (long long)r.finetune_steps, tuned.c_str());
  s += buf;
  if (r.bench_before && r.bench_after) {
    const BenchRow &a = *r.bench_before, &b = *r.bench_after;
    std::snprintf(buf, sizeof buf,
                  "  training step (bench, technique none): peak %.2f MiB -> %.2f MiB (%.1f%% less), "
                  "%.1f ms -> %.1f ms per step (median)\n",
                  mib(a.memory.peak), mib(b.memory.peak), 100.0 * (1.0 - double(b.memory.peak) / double(a.memory.peak)),
                  a.ms_per_step, b.ms_per_step);
    s += buf;
  }
  return s;
}

BenchRow bench_pruned_run(const RunDir& run, int64_t steps, const std::string& dir) {
  const nlohmann::json config = run.read_config();
  return bench_one(steps, config, dir, config.value("command", "") == "gpt train");
}

std::unique_ptr<MagnitudeMask> attach_prune_masks(const RunDir& run, Module& model, Optimizer& opt, int64_t step) {
  const nlohmann::json config = run.read_config();
  if (!config.contains("pruning") || !config["pruning"].contains("masks")) return nullptr;
  const nlohmann::json& record = config["pruning"];
  const std::string path = run.file(record["masks"].get<std::string>());
  MG_CHECK(fs::exists(path), "the pruned run '", run.path(), "' lacks its masks file '", path, "'");
  NamedTensors masks;
  {
    MemoryCategoryGuard guard(MemoryCategory::other);
    masks = load_safetensors(path);
  }
  auto mask = std::make_unique<MagnitudeMask>(model, masks);
  if (!record.contains("schedule")) {
    opt.add_post_step_hook([m = mask.get()] { m->apply(); });
    return mask;
  }
  // Gradual: the sparsity the schedule wants at this step (a resumed run catches up), then after
  // every optimizer step the masks rise on the schedule's update steps and are applied.
  const GradualSchedule sched = GradualSchedule::from_json(record["schedule"]);
  const PruneScope scope = parse_prune_scope(record.value("scope", "layer"));
  mask->prune_to(sched.sparsity_at(step), scope);
  opt.add_post_step_hook([m = mask.get(), sched, scope, t = step]() mutable {
    ++t;
    if (sched.updates_at(t)) m->prune_to(sched.sparsity_at(t), scope);
    else m->apply();
  });
  return mask;
}

}  // namespace mg
