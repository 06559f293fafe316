// `memgrad quantize --run DIR --mode ptq --calibrate N [--observer ...] --out DIR2`: apps/quantize.h
// behind the command line, and the evaluation both models go through (same batches, same timer).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "apps/commands.h"
#include "apps/quantize.h"
#include "apps/run_dir.h"
#include "apps/run_setup.h"
#include "apps/vision_train.h"
#include "autograd/grad_mode.h"
#include "data/data_loader.h"
#include "data/token_window_dataset.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "ops/int8_gemm.h"
#include "ops/ops.h"

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

void check_options(const QuantizeOptions& o) {
  MG_CHECK(!o.run.empty(), kCmd, ": --run is required");
  MG_CHECK(!o.out.empty(), kCmd, ": --out is required (a new run directory for the quantized model)");
  MG_CHECK(o.mode == "ptq", kCmd, ": --mode '", o.mode, "' is not supported (known: ptq; QAT is not implemented)");
  MG_CHECK(o.calibrate >= 1, kCmd, ": --calibrate ", o.calibrate,
           ": post-training quantization needs at least one calibration batch to measure activation ranges");
  parse_observer_kind(o.observer);  // throws listing the names
  MG_CHECK(!fs::exists(o.out), kCmd, ": --out '", o.out, "' already exists (choose a new directory)");
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
  // calibration reads the first `calibrate` training batches, unaugmented
  VisionData data = load_vision_data(dj.at("source").get<std::string>(), cfg.input_size, false, 0,
                                     o.calibrate * batch, limit);
  Generator scratch(0);
  auto model = std::make_shared<MobileNetV2>(cfg, InitOptions{.gen = &scratch, .device = dev});
  run.load_weights(*model);
  r.fp32_weight_bytes = weight_bytes(*model);
  const Eval fp32 = eval_vision(*model, data.test, batch, dev);

  NoGradGuard ng;
  model->eval();
  fold_batch_norms(*model);
  prepare_ptq(*model, {.kind = parse_observer_kind(o.observer)});
  DataLoader calib(data.train, {.batch_size = batch, .prefetch = 0, .device = dev});
  int64_t batches = 0;
  while (batches < o.calibrate) {
    auto b = calib.next();
    if (!b) break;
    (*model)(b->input);
    ++batches;
  }
  MG_CHECK(batches >= 1, kCmd, ": the training set of '", o.run, "' gave no calibration batch");
  convert_ptq(*model);
  r.int8_weight_bytes = weight_bytes(*model);
  const Eval int8 = eval_vision(*model, data.test, batch, dev);
  record(r, "mobilenetv2", "test accuracy", fp32, int8, o);
  save_quantized(r.file, *model,
                 {.model = "mobilenetv2", .config = cfg.to_json(), .scheme = "int8_ptq",
                  .calibration = {{"observer", o.observer}, {"batches", batches}}, .layers = {}});
  return r;
}

QuantizeResult quantize_gpt(const QuantizeOptions& o, const RunDir& run, const nlohmann::json& config, QuantizeResult r,
                            Device dev) {
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
  quantize_gpt_weight_only(*model);
  r.int8_weight_bytes = weight_bytes(*model);
  const Eval int8 = eval_gpt(*model, val, batch, dev);
  record(r, "gpt", "val loss", fp32, int8, o);
  save_quantized(r.file, *model,
                 {.model = "gpt", .config = cfg.to_json(), .scheme = "int8_weight_only", .calibration = {}, .layers = {}});
  return r;
}

}  // namespace

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
  r = command == "vision train" ? quantize_vision(o, run, config, r, dev) : quantize_gpt(o, run, config, r, dev);
  config[kQuantizedConfigKey] = {{"file", kQuantizedModelFile}, {"mode", o.mode},
                                 {"source_run", fs::absolute(o.run).lexically_normal().string()},
                                 {"fp32_" + std::string(r.model == "gpt" ? "val_loss" : "accuracy"), r.fp32_metric},
                                 {"int8_" + std::string(r.model == "gpt" ? "val_loss" : "accuracy"), r.int8_metric},
                                 {"fp32_weight_bytes", r.fp32_weight_bytes}, {"int8_weight_bytes", r.int8_weight_bytes}};
  if (r.model == "mobilenetv2") config[kQuantizedConfigKey]["calibration"] = {{"observer", o.observer}, {"batches", o.calibrate}};
  RunDir(o.out).write_config(config);
  return r;
}

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* q = app.add_subcommand("quantize", "Post-training int8 quantization of a trained run, compared with fp32");
  q->add_option("--run", o->run, "run directory (from vision train or gpt train)")->required();
  q->add_option("--out", o->out, "new run directory for the int8 model")->required();
  q->add_option("--mode", o->mode, "ptq (post-training quantization)")->capture_default_str();
  q->add_option("--calibrate", o->calibrate, "calibration batches (vision)")->capture_default_str();
  q->add_option("--observer", o->observer, "activation range observer: minmax, ema, percentile")->capture_default_str();
  q->add_option("--batch", o->batch, "batch size (default: the run's)");
  q->add_option("--limit-test", o->limit_test, "vision: use the first N test images (default: the run's; 0: all)");
  q->add_option("--eval-windows", o->eval_windows, "gpt: validation windows")->capture_default_str();
  q->add_option("--device", o->device, "device, e.g. cpu:0")->capture_default_str();
  q->callback([o] {
    const QuantizeResult r = quantize_run(*o);
    const bool acc = r.model == "mobilenetv2";
    const char* unit = acc ? "images/s" : "tokens/s";
    std::printf("quantize: %s -> %s (%s, int8 path %s)\n", o->run.c_str(), r.file.c_str(), r.model.c_str(),
                int8_gemm_path());
    std::printf("  %-6s %-14s %-16s %s\n", "", r.metric.c_str(), "weight bytes", unit);
    auto row = [&](const char* name, double metric, int64_t bytes, double per_s) {
      if (acc) std::printf("  %-6s %13.2f%% %16lld %10.1f\n", name, 100 * metric, (long long)bytes, per_s);
      else std::printf("  %-6s %14.4f %16lld %10.1f\n", name, metric, (long long)bytes, per_s);
    };
    row("fp32", r.fp32_metric, r.fp32_weight_bytes, r.fp32_per_s);
    row("int8", r.int8_metric, r.int8_weight_bytes, r.int8_per_s);
    std::printf("  weight bytes %.2fx smaller, %s %.2fx, on %lld %s\n",
                double(r.fp32_weight_bytes) / double(r.int8_weight_bytes), unit, r.int8_per_s / r.fp32_per_s,
                (long long)r.examples, acc ? "test images" : "validation windows");
  });
}

}  // namespace mg
