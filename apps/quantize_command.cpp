// `memgrad quantize --run DIR --mode ptq|qat [--calibrate N] [--qat-steps N] [--qat-scales observed|learned]
// [--observer ...] --out DIR2`:
// apps/quantize.h behind the command line, the QAT fine-tuning loop, and the evaluation both
// models go through (same batches, same timer).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <tuple>

#include "apps/commands.h"
#include "apps/quantize.h"
#include "apps/run_dir.h"
#include "apps/run_setup.h"
#include "apps/vision_train.h"
#include "autograd/grad_mode.h"
#include "data/data_loader.h"
#include "data/token_window_dataset.h"
#include "apps/technique_flags.h"
#include "models/compress/int8_outlier_linear.h"
#include "models/compress/qat.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "ops/int8_gemm.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/trainer.h"

namespace mg {
namespace {

namespace fs = std::filesystem;
constexpr const char* kCmd = "quantize";
using Clock = std::chrono::steady_clock;

struct Eval {
  double metric = 0, per_s = 0;
  int64_t examples = 0;
};

// Test accuracy and images/s (forward time only) over the whole test set.
Eval eval_vision(MobileNetV2& model, const std::shared_ptr<const Dataset>& test, int64_t batch, Device dev) {
  NoGradGuard ng;
  model.eval();
  DataLoader loader(test, {.batch_size = batch, .prefetch = 0, .device = dev});
  int64_t correct = 0, n = 0;
  double seconds = 0;
  while (auto b = loader.next()) {
    const auto t0 = Clock::now();
    Tensor logits = model(b->input);
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    const auto pred = argmax(logits, 1).to_vector<int64_t>(), label = b->target.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == label[i];
    n += b->size();
  }
  MG_CHECK(n > 0, kCmd, ": the test set is empty");
  return {double(correct) / double(n), double(n) / seconds, n};
}

// Mean validation loss and tokens/s over the validation windows.
Eval eval_gpt(GPT& model, const std::shared_ptr<const Dataset>& val, int64_t batch, Device dev) {
  NoGradGuard ng;
  model.eval();
  DataLoader loader(val, {.batch_size = batch, .prefetch = 0, .device = dev});
  double sum = 0, seconds = 0;
  int64_t n = 0, tokens = 0;
  while (auto b = loader.next()) {
    const auto t0 = Clock::now();
    const double loss = model.loss(b->input, b->target).item();
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    sum += loss * double(b->size());
    n += b->size();
    tokens += b->input.numel();
  }
  MG_CHECK(n > 0, kCmd, ": the validation set is empty");
  return {sum / double(n), double(tokens) / seconds, n};
}

// The observer a mode uses when --observer is not given.
std::string observer_of(const QuantizeOptions& o) {
  return !o.observer.empty() ? o.observer : o.mode == "qat" ? "ema" : "minmax";
}

// --qat-scales, observed when not given.
QatScales qat_scales_of(const QuantizeOptions& o) {
  if (o.qat_scales.empty()) return QatScales::observed;
  MG_CHECK(o.qat_scales == "observed" || o.qat_scales == "learned", kCmd, ": --qat-scales '", o.qat_scales,
           "' is not supported (known: observed, learned)");
  return parse_qat_scales(o.qat_scales);
}

void check_options(const QuantizeOptions& o) {
  MG_CHECK(!o.run.empty(), kCmd, ": --run is required");
  MG_CHECK(!o.out.empty(), kCmd, ": --out is required (a new run directory for the quantized model)");
  MG_CHECK(o.mode == "ptq" || o.mode == "qat", kCmd, ": --mode '", o.mode, "' is not supported (known: ptq, qat)");
  const ObserverKind observer = parse_observer_kind(observer_of(o));  // throws listing the names
  if (o.mode == "ptq") {
    MG_CHECK(o.calibrate >= 1, kCmd, ": --calibrate ", o.calibrate,
             ": post-training quantization needs at least one calibration batch to measure activation ranges");
    MG_CHECK(o.qat_steps == 0, kCmd, ": --qat-steps is for --mode qat (post-training quantization does not train)");
    MG_CHECK(o.qat_scales.empty(), kCmd, ": --qat-scales is for --mode qat (post-training quantization learns no scales)");
    MG_CHECK(!o.qat_scale_lr, kCmd, ": --qat-scale-lr is for --mode qat --qat-scales learned (post-training quantization learns no scales)");
  } else {
    MG_CHECK(o.qat_steps >= 1, kCmd, ": --mode qat needs --qat-steps N with N >= 1 (got ", o.qat_steps,
             "): the fine-tuning steps that also observe the activation ranges");
    MG_CHECK(o.qat_lr > 0 && std::isfinite(o.qat_lr), kCmd, ": --qat-lr must be positive, got ", o.qat_lr);
    if (o.qat_scale_lr) {
      MG_CHECK(qat_scales_of(o) == QatScales::learned, kCmd,
               ": --qat-scale-lr needs --qat-scales learned (observed scales are recomputed, not trained)");
      MG_CHECK(*o.qat_scale_lr > 0 && std::isfinite(*o.qat_scale_lr), kCmd,
               ": --qat-scale-lr must be a positive finite factor of --qat-lr, got ", *o.qat_scale_lr);
    }
    qat_scales_of(o);  // throws listing the names
    MG_CHECK(observer == ObserverKind::minmax || observer == ObserverKind::ema, kCmd, ": --observer ",
             observer_kind_name(observer), " is not available with --mode qat (known: minmax, ema)");
    MG_CHECK(o.techniques.precision != Precision::bf16_pure, kCmd,
             ": --precision bf16-pure is not available with --mode qat (the int8 conversion reads f32 master weights; "
             "use --precision bf16 for autocast)");
  }
  MG_CHECK(o.gpt_mode == "weight-only" || o.gpt_mode == "int8-outlier", kCmd, ": --gpt-mode '", o.gpt_mode,
           "' is not supported (known: weight-only, int8-outlier)");
  MG_CHECK(o.outlier_threshold >= 0 && !std::isnan(o.outlier_threshold), kCmd, ": --outlier-threshold must be >= 0 (or inf), got ",
           o.outlier_threshold);
  MG_CHECK(!fs::exists(o.out), kCmd, ": --out '", o.out, "' already exists (choose a new directory)");
}

// Quantization-aware fine-tuning of a folded MobileNetV2 for o.qat_steps steps over the training
// set (shuffled, epochs repeating); returns the first and last step's loss.
std::pair<double, double> qat_finetune(MobileNetV2& model, const QuantizeOptions& o,
                                       const std::shared_ptr<const Dataset>& train, int64_t batch, Device dev) {
  prepare_qat(model, {.observer = parse_observer_kind(observer_of(o)), .scales = qat_scales_of(o)});
  model.set_checkpoint(o.techniques.checkpoint);
  model.train();
  TrainOptions t;
  t.lr = o.qat_lr;
  t.warmup = 0;
  const LrSchedule sched = t.schedule(o.qat_steps);
  std::unique_ptr<Optimizer> opt = qat_optimizer(t, model, o.qat_scale_lr.value_or(1.0));
  Trainer trainer(model, *opt, o.techniques.trainer_options(0.0));
  DataLoader loader(train, {.batch_size = batch, .shuffle = true, .seed = 1, .drop_last = true, .device = dev});
  MG_CHECK(loader.batches_per_epoch() >= 1, kCmd, ": the training set of '", o.run, "' has fewer than ", batch,
           " images, not one batch for --mode qat");
  std::pair<double, double> losses;
  for (int64_t step = 0; step < o.qat_steps; ++step) {
    std::optional<Batch> b = loader.next();
    if (!b) b = loader.next();  // the next epoch
    opt->set_lr(sched(step));
    const StepReport r = trainer.step(b->size(), [&](int64_t begin, int64_t count) {
      return cross_entropy(model(narrow(b->input, 0, begin, count)), narrow(b->target, 0, begin, count));
    });
    MG_CHECK(std::isfinite(r.loss), kCmd, ": the QAT loss became ", r.loss, " at step ", step + 1,
             "\n  hint: lower --qat-lr");
    if (step == 0) losses.first = r.loss;
    losses.second = r.loss;
    if ((step + 1) % 50 == 0 || step + 1 == o.qat_steps)
      std::fprintf(stderr, "quantize: qat step %lld/%lld  loss %.4f  lr %.2e\n", (long long)(step + 1),
                   (long long)o.qat_steps, r.loss, sched(step));
  }
  model.set_checkpoint({});
  model.eval();
  return losses;
}

// The fp32 and int8 figures of a model into r, and the output file in a created run directory.
void record(QuantizeResult& r, const char* model, const char* metric, const Eval& fp32, const Eval& int8,
            const QuantizeOptions& o) {
  r.model = model;
  r.metric = metric;
  r.fp32_metric = fp32.metric;
  r.int8_metric = int8.metric;
  r.fp32_per_s = fp32.per_s;
  r.int8_per_s = int8.per_s;
  r.examples = fp32.examples;
  RunDir out(o.out);
  out.create();
  r.file = out.file(kQuantizedModelFile);
}

QuantizeResult quantize_vision(const QuantizeOptions& o, const RunDir& run, const nlohmann::json& config,
                               QuantizeResult r, Device dev) {
  const MobileNetV2Config cfg = MobileNetV2Config::from_json(config.at("model"));
  const auto& dj = config.at("data");
  const int64_t limit = o.limit_test >= 0 ? o.limit_test : dj.value("limit_test", int64_t(0));
  const int64_t batch = o.batch > 0 ? o.batch : config.value("batch", int64_t(64));
  // ptq calibrates on the first `calibrate` training batches, unaugmented; qat fine-tunes on the
  // run's training set as the run saw it
  const bool qat = o.mode == "qat";
  MG_CHECK(o.gpt_mode == "weight-only", kCmd, ": --gpt-mode is for gpt runs; '", o.run, "' is a vision run");
  VisionData data = qat ? load_vision_data(dj.at("source").get<std::string>(), cfg.input_size,
                                           dj.value("augment", false), config.value("seed", uint64_t(1)),
                                           dj.value("limit_train", int64_t(0)), limit)
                        : load_vision_data(dj.at("source").get<std::string>(), cfg.input_size, false, 0,
                                           o.calibrate * batch, limit);
  Generator scratch(0);
  auto model = std::make_shared<MobileNetV2>(cfg, InitOptions{.gen = &scratch, .device = dev});
  run.load_weights(*model);
  r.fp32_weight_bytes = weight_bytes(*model);
  const Eval fp32 = eval_vision(*model, data.test, batch, dev);

  model->eval();
  fold_batch_norms(*model);
  nlohmann::json calibration = {{"observer", r.observer}};
  if (qat) {
    std::tie(r.qat_first_loss, r.qat_last_loss) = qat_finetune(*model, o, data.train, batch, dev);
    calibration["qat_steps"] = o.qat_steps;
    calibration["qat_lr"] = o.qat_lr;
    if (o.qat_scale_lr) calibration["qat_scale_lr"] = *o.qat_scale_lr;
    calibration["qat_scales"] = qat_scales_name(qat_scales_of(o));
    calibration["techniques"] = o.techniques.to_json();
    NoGradGuard ng;
    convert_qat(*model);
  } else {
    NoGradGuard ng;
    prepare_ptq(*model, {.kind = parse_observer_kind(r.observer)});
    DataLoader calib(data.train, {.batch_size = batch, .prefetch = 0, .device = dev});
    int64_t batches = 0;
    while (batches < o.calibrate) {
      auto b = calib.next();
      if (!b) break;
      (*model)(b->input);
      ++batches;
    }
    MG_CHECK(batches >= 1, kCmd, ": the training set of '", o.run, "' gave no calibration batch");
    calibration["batches"] = batches;
    convert_ptq(*model);
  }
  r.int8_weight_bytes = weight_bytes(*model);
  const Eval int8 = eval_vision(*model, data.test, batch, dev);
  record(r, "mobilenetv2", "test accuracy", fp32, int8, o);
  save_quantized(r.file, *model,
                 {.model = "mobilenetv2", .config = cfg.to_json(), .scheme = qat ? "int8_qat" : "int8_ptq",
                  .calibration = calibration, .layers = {}});
  return r;
}

QuantizeResult quantize_gpt(const QuantizeOptions& o, const RunDir& run, const nlohmann::json& config, QuantizeResult r,
                            Device dev) {
  MG_CHECK(o.mode == "ptq", kCmd, ": --mode ", o.mode, " is available for vision runs only; '", o.run,
           "' is a gpt run (use --mode ptq)");
  const GPTConfig cfg = GPTConfig::from_json(config.at("model"));
  const auto& dj = config.at("data");
  std::string tf = dj.at("token_file").get<std::string>();
  if (!fs::path(tf).is_absolute()) tf = run.file(tf);
  MG_CHECK(fs::exists(tf), kCmd, ": the run's token file '", tf, "' does not exist");
  auto file = std::make_shared<const TokenFile>(tf);
  auto [train_region, val_region] = split_train_val(file->size(), dj.value("val_fraction", 0.1));
  const int64_t available = (val_region.end - val_region.begin - 1) / cfg.context;
  MG_CHECK(available >= 1, kCmd, ": the validation split of '", tf, "' is shorter than one window");
  auto val = std::make_shared<TokenWindowDataset>(
      file, TokenWindowOptions{.context = cfg.context, .region = val_region, .random = false,
                               .samples_per_epoch = std::min(o.eval_windows, available)});
  const int64_t batch = o.batch > 0 ? o.batch : config.value("batch", int64_t(8));
  Generator scratch(0);
  auto model = std::make_shared<GPT>(cfg, InitOptions{.gen = &scratch, .device = dev});
  run.load_weights(*model);
  r.fp32_weight_bytes = weight_bytes(*model);
  const Eval fp32 = eval_gpt(*model, val, batch, dev);
  const bool outlier = o.gpt_mode == "int8-outlier";
  if (outlier) quantize_gpt_int8_outlier(*model, float(o.outlier_threshold));
  else quantize_gpt_weight_only(*model);
  r.int8_weight_bytes = weight_bytes(*model);
  const Eval int8 = eval_gpt(*model, val, batch, dev);
  record(r, "gpt", "val loss", fp32, int8, o);
  nlohmann::json calibration = nlohmann::json::object();
  if (outlier) {
    calibration["outlier_threshold"] = o.outlier_threshold;
    // the share of (row, column) activations the last evaluation batch kept in f32, per layer kind
    int64_t cols = 0, all = 0;
    for (auto& [name, m] : model->named_modules())
      if (auto* l = dynamic_cast<Int8OutlierLinear*>(m)) cols += l->last_outlier_columns, all += l->in_features;
    r.outlier_column_share = all > 0 ? double(cols) / double(all) : 0.0;
    calibration["outlier_column_share"] = r.outlier_column_share;
  }
  save_quantized(r.file, *model,
                 {.model = "gpt", .config = cfg.to_json(), .scheme = outlier ? "int8_outlier" : "int8_weight_only",
                  .calibration = calibration, .layers = {}});
  return r;
}

}  // namespace

std::unique_ptr<Optimizer> qat_optimizer(const TrainOptions& t, Module& model, double scale_lr) {
  const NamedTensors scales = learned_qat_scales(model);
  NamedTensors rest;
  for (auto& [name, p] : model.named_parameters()) {
    const std::string& param_name = name;  // a lambda cannot capture a structured binding (C++17, clang 14)
    if (std::none_of(scales.begin(), scales.end(), [&](const auto& s) { return s.first == param_name; }))
      rest.emplace_back(name, p);
  }
  std::vector<ParamGroup> groups = weight_decay_groups(rest, t.lr, t.weight_decay);
  if (!scales.empty())
    groups.push_back({.name = "qat_scales", .params = scales, .lr = t.lr * scale_lr, .weight_decay = 0.0,
                      .lr_scale = scale_lr});
  return std::make_unique<AdamW>(std::move(groups));
}

QuantizeResult quantize_run(const QuantizeOptions& o) {
  check_options(o);
  RunDir run(o.run);
  MG_CHECK(run.has_config(), kCmd, ": '", o.run, "' is not a run directory (no config.json)");
  nlohmann::json config = run.read_config();
  MG_CHECK(!config.contains(kQuantizedConfigKey) && !fs::exists(run.file(kQuantizedModelFile)), kCmd, ": '", o.run,
           "' is already a quantized run (made by memgrad quantize); quantize the fp32 run it came from");
  const std::string command = config.value("command", "");
  MG_CHECK(command == "vision train" || command == "gpt train", kCmd, ": '", o.run, "' is a '", command,
           "' run; quantize takes a 'vision train' or 'gpt train' run");
  const Device dev = open_device(o.device, "");
  QuantizeResult r;
  r.observer = observer_of(o);
  r = command == "vision train" ? quantize_vision(o, run, config, r, dev) : quantize_gpt(o, run, config, r, dev);
  config[kQuantizedConfigKey] = {{"file", kQuantizedModelFile}, {"mode", o.mode},
                                 {"source_run", fs::absolute(o.run).lexically_normal().string()},
                                 {"fp32_" + std::string(r.model == "gpt" ? "val_loss" : "accuracy"), r.fp32_metric},
                                 {"int8_" + std::string(r.model == "gpt" ? "val_loss" : "accuracy"), r.int8_metric},
                                 {"fp32_weight_bytes", r.fp32_weight_bytes}, {"int8_weight_bytes", r.int8_weight_bytes}};
  if (r.model == "mobilenetv2") config[kQuantizedConfigKey]["calibration"] = read_quantized_info(r.file).calibration;
  RunDir(o.out).write_config(config);
  return r;
}

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* q = app.add_subcommand("quantize", "Int8 quantization of a trained run (post-training or quantization-aware), compared with fp32");
  q->add_option("--run", o->run, "run directory (from vision train or gpt train)")->required();
  q->add_option("--out", o->out, "new run directory for the int8 model")->required();
  q->add_option("--mode", o->mode, "ptq (post-training quantization) or qat (quantization-aware fine-tuning, vision)")
      ->capture_default_str();
  q->add_option("--calibrate", o->calibrate, "ptq: calibration batches (vision)")->capture_default_str();
  q->add_option("--observer", o->observer,
                "activation range observer: minmax, ema, percentile, mse (histogram, least quantization error) (default: minmax for ptq, ema for qat)");
  q->add_option("--qat-steps", o->qat_steps, "qat: fine-tuning steps on the run's training data");
  q->add_option("--qat-lr", o->qat_lr, "qat: peak learning rate (cosine schedule, AdamW)")->capture_default_str();
  q->add_option("--qat-scales", o->qat_scales,
                "qat: observed (weight max / 127 and the observer's input range, every step) or learned (LSQ: "
                "trained from there) (default: observed)");
  q->add_option("--qat-scale-lr", o->qat_scale_lr,
                "qat with --qat-scales learned: the scales' learning rate as a factor of --qat-lr (no weight decay "
                "on them; the schedule scales both) (default: 1)");
  q->add_option("--gpt-mode", o->gpt_mode,
                "gpt: weight-only (int8 weights, f32 math) or int8-outlier (LLM.int8(): int8 GEMM, outlier columns in f32)")
      ->capture_default_str();
  q->add_option("--outlier-threshold", o->outlier_threshold, "gpt int8-outlier: |activation| above this keeps a column in f32")
      ->capture_default_str();
  for (CLI::Option* f : add_technique_flags(q, o->techniques)) f->group("QAT techniques");
  for (const char* untested : {"--auto-fit", "--profile", "--offload-activations"}) q->remove_option(q->get_option(untested));
  q->add_option("--batch", o->batch, "batch size (default: the run's)");
  q->add_option("--limit-test", o->limit_test, "vision: use the first N test images (default: the run's; 0: all)");
  q->add_option("--eval-windows", o->eval_windows, "gpt: validation windows")->capture_default_str();
  q->add_option("--device", o->device, "device, e.g. cpu:0")->capture_default_str();
  q->callback([o] {
    const QuantizeResult r = quantize_run(*o);
    const bool acc = r.model == "mobilenetv2";
    const char* unit = acc ? "images/s" : "tokens/s";
    std::printf("quantize: %s -> %s (%s, %s, int8 path %s)\n", o->run.c_str(), r.file.c_str(), r.model.c_str(),
                o->mode.c_str(), int8_gemm_path());
    if (r.model == "gpt" && o->gpt_mode == "int8-outlier")
      std::printf("  gpt mode int8-outlier, threshold %g: %.2f%% of the Linear input columns in f32 (last batch)\n",
                  o->outlier_threshold, 100 * r.outlier_column_share);
    else if (r.model == "gpt")
      std::printf("  gpt mode weight-only\n");
    if (o->mode == "qat")
      std::printf("  qat: %lld steps, %s scales, loss %.4f -> %.4f\n", (long long)o->qat_steps,
                  qat_scales_name(qat_scales_of(*o)), r.qat_first_loss, r.qat_last_loss);
    std::printf("  %-6s %-14s %-16s %s\n", "", r.metric.c_str(), "weight bytes", unit);
    auto row = [&](const char* name, double metric, int64_t bytes, double per_s) {
      if (acc) std::printf("  %-6s %13.2f%% %16lld %10.1f\n", name, 100 * metric, (long long)bytes, per_s);
      else std::printf("  %-6s %14.5f %16lld %10.1f\n", name, metric, (long long)bytes, per_s);
    };
    row("fp32", r.fp32_metric, r.fp32_weight_bytes, r.fp32_per_s);
    row(o->mode == "qat" ? "qat" : r.model == "gpt" ? "int8" : "ptq", r.int8_metric, r.int8_weight_bytes, r.int8_per_s);
    std::printf("  weight bytes %.2fx smaller, %s %.2fx, on %lld %s\n",
                double(r.fp32_weight_bytes) / double(r.int8_weight_bytes), unit, r.int8_per_s / r.fp32_per_s,
                (long long)r.examples, acc ? "test images" : "validation windows");
  });
}

}  // namespace mg
