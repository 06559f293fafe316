// GPT training, evaluation and sampling (see gpt_train.h). Training plugs the GPT's parts into
// the shared loop (apps/training_loop.h): random windows of the token file as batches, the model's
// next-token loss, validation loss every eval_every steps. Everything random derives from the
// seed: the weights (their own generator, used once), the windows (a pure function of (seed,
// epoch, index), so the loader's position is all a checkpoint needs) and dropout.
#include "apps/gpt_train.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "apps/ddp_setup.h"
#include "apps/quantize.h"
#include "apps/run_dir.h"
#include "apps/run_plan.h"
#include "apps/run_setup.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "data/token_window_dataset.h"
#include "data/tokenizer.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "models/compress/sparse_linear.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "optim/trainer.h"
#include "parallel/tensor_parallel.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCmd = "gpt train";
constexpr const char* kCacheFile = "data.tokens";  // the tokenized corpus, inside the run dir
constexpr double kValFraction = 0.1;
// Keys that split the seed into independent streams.
constexpr uint64_t kInitKey = 1, kDataKey = 2, kDropoutKey = 3;

// --data -> the token file to train on: used as is when it is one (by its magic), otherwise the
// text (a file or a folder) is byte-tokenized into <run>/data.tokens. Returns config.json's "data".
nlohmann::json prepare_data(const RunDir& run, const std::string& data, std::string& note) {
  const std::string source = data.empty() ? kFortunesDir : data;
  MG_CHECK(fs::exists(source), kCmd, ": --data '", source, "' does not exist",
           data.empty() ? "\n  hint: the default corpus is Debian's `fortunes` package; run scripts/setup, or "
                          "pass --data with a text file, a folder of text or a token file"
                        : "");
  const std::string abs = fs::absolute(source).lexically_normal().string();
  if (fs::is_regular_file(source) && is_token_file(source))
    return {{"source", abs}, {"token_file", abs}, {"val_fraction", kValFraction}};
  run.create();
  TokenizeSummary s = tokenize_files({source}, run.file(kCacheFile));
  note = "tokenized " + std::to_string(s.files) + " files of " + abs + " into " + run.file(kCacheFile) + " (" +
         std::to_string(s.tokens) + " tokens)";
  return {{"source", abs}, {"token_file", kCacheFile}, {"val_fraction", kValFraction}};
}

// The token file of a run: a relative path is inside the run dir (the cache), re-made from the
// source when it was deleted.
std::string token_file_of(const RunDir& run, const nlohmann::json& data) {
  std::string tf = data.at("token_file").get<std::string>();
  if (fs::path(tf).is_absolute()) {
    MG_CHECK(fs::exists(tf), kCmd, ": the run's token file '", tf, "' no longer exists");
    return tf;
  }
  if (!fs::exists(run.file(tf))) tokenize_files({data.at("source").get<std::string>()}, run.file(tf));
  return run.file(tf);
}

nlohmann::json make_config(const GptTrainOptions& o, const GPTConfig& cfg, const nlohmann::json& data,
                           const LrSchedule& sched) {
  nlohmann::json c = {{"command", kCmd},
                      {"model_name", o.model ? std::string("custom") : o.config},
                      {"model", cfg.to_json()},
                      {"data", data},
                      {"steps", o.steps},
                      {"eval_every", o.eval_every},
                      {"eval_windows", o.eval_windows}};
  if (!o.init_from.empty()) c["init_from"] = fs::absolute(o.init_from).lexically_normal().string();
  c.update(o.to_config(sched));
  return c;
}

void check_options(const GptTrainOptions& o) {
  o.validate(kCmd);
  MG_CHECK(o.steps > 0, kCmd, ": --steps must be positive, got ", o.steps);
  MG_CHECK(o.eval_every > 0 && o.checkpoint_every > 0, kCmd, ": --eval-every and --checkpoint-every must be positive");
  MG_CHECK(o.warmup < o.steps, kCmd, ": --warmup (", o.warmup, ") must be smaller than --steps (", o.steps, ")");
  MG_CHECK(o.eval_windows > 0, kCmd, ": eval_windows must be positive, got ", o.eval_windows);
  MG_CHECK(o.init_from.empty() || fs::is_regular_file(o.init_from), kCmd, ": --init-from '", o.init_from,
           "' is not a file (give a Hugging Face GPT-2 model.safetensors)");
  o.techniques.validate(o.batch, Device(o.device));
  o.parallel.validate(kCmd, o.techniques.micro_batch, o.techniques.auto_fit, o.techniques.offload_activations.has_value(),
                      !o.plan.empty());
}

// The entropy (nats per token) of the region's token frequencies: the loss a model that ignores
// context could at best reach, so a trained model's validation loss must be far below it.
double unigram_entropy(const TokenFile& file, TokenRegion region) {
  std::vector<int64_t> counts;
  std::vector<int64_t> chunk(1 << 16);
  for (int64_t i = region.begin; i < region.end; i += int64_t(chunk.size())) {
    const int64_t n = std::min<int64_t>(int64_t(chunk.size()), region.end - i);
    file.read(i, n, chunk.data());
    for (int64_t k = 0; k < n; ++k) {
      if (size_t(chunk[size_t(k)]) >= counts.size()) counts.resize(size_t(chunk[size_t(k)]) + 1, 0);
      ++counts[size_t(chunk[size_t(k)])];
    }
  }
  const double total = double(region.end - region.begin);
  double h = 0.0;
  for (int64_t c : counts)
    if (c > 0) h -= double(c) / total * std::log(double(c) / total);
  return h;
}

// Mean loss over the windows of `val` (eval mode, no graph), weighted by counted targets.
double validation_loss(GPT& model, const std::shared_ptr<const Dataset>& val, int64_t batch, Device device,
                       Precision precision) {
  NoGradGuard no_grad;
  AutocastGuard autocast(autocast_for(precision));
  EvalGuard eval_mode(model);
  DataLoader loader(val, {.batch_size = batch, .prefetch = 0, .device = device});
  double sum = 0.0;
  int64_t n = 0;
  while (auto b = loader.next()) {
    sum += model.loss(b->input, b->target).item() * double(b->size());
    n += b->size();
  }
  return sum / double(n);
}

// How many next-token targets of batch rows [begin, begin + count) the loss counts (GPT::loss
// ignores GPT::kIgnoreIndex targets): the micro-batch's weight in gradient accumulation.
double counted_targets(const Tensor& target, int64_t begin, int64_t count) {
  if (target.is_meta()) return double(count * target.size(1));  // no values: every target counts
  // Read on the host (a GPU batch's targets come back: count x T integers per micro-batch).
  Tensor t = to(contiguous(narrow(target, 0, begin, count)), kCPU);
  const int64_t* p = t.data<int64_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += p[i] != GPT::kIgnoreIndex;
  return double(n);
}

// Validation windows of the token file's last kValFraction (all of `region` when given).
std::shared_ptr<const Dataset> validation_windows(const std::shared_ptr<const TokenFile>& file, TokenRegion region,
                                                  int64_t context, int64_t windows) {
  const int64_t available = (region.end - region.begin - 1) / context;
  MG_CHECK(available >= 1, "gpt: the validation split of '", file->path(), "' (", region.end - region.begin,
           " tokens) is shorter than one window of ", context + 1, " tokens\n  hint: use more text or a smaller context");
  return std::make_shared<TokenWindowDataset>(
      file, TokenWindowOptions{.context = context, .region = region, .random = false,
                               .samples_per_epoch = std::min(windows, available)});
}

// One training step of this run's model on meta, for --split balanced: the run's precision,
// checkpointing and optimizer, one micro-batch's activations.
StepProbe gpt_probe(const GPTConfig& cfg, const GptTrainOptions& o) {
  const int64_t rows = o.techniques.micro_batch > 0 ? o.techniques.micro_batch : o.batch;
  return with_run_techniques<GPT>(gpt_step_probe(cfg, rows, cfg.context, [&o](Module& m) { return make_optimizer(o, m); }),
                                 o.techniques);
}

}  // namespace

GptTrainResult gpt_train(const GptTrainOptions& in) {
  GptTrainOptions o = in;
  prepare_data_parallel(o, kCmd);  // --ddp: this rank's device, run directory and output
  const bool resuming = !o.resume.empty();
  // The model is built on --device; a split one is then placed on its devices (place_model).
  // Budgets are set once the run's devices are known (a resumed run's come from config.json).
  const Device device = open_device(o.device, "");
  RunDir run = resuming ? resume_run_dir(o.resume, kCmd)
                        : new_run_dir(o.out, o.model ? "gpt" : o.config, kCmd);
  std::string data_note;

  GPTConfig cfg;
  LrSchedule sched;
  nlohmann::json config;
  if (resuming) {
    config = run.read_config();
    sched = o.read_config(config, kCmd);
    try {
      o.steps = config.at("steps");
      o.eval_every = config.at("eval_every");
      o.eval_windows = config.at("eval_windows");
      cfg = GPTConfig::from_json(config.at("model"));
    } catch (const nlohmann::json::exception& e) {
      MG_THROW(kCmd, ": config.json of '", o.resume, "' is incomplete or malformed: ", e.what());
    }
    if (in.resume_steps > 0 && in.resume_steps != o.steps) {  // a new total: the schedule stretches
      const int64_t done = run.read_checkpoint_state().step;
      MG_CHECK(in.resume_steps >= done && in.resume_steps > sched.warmup_steps, kCmd, ": --steps ", in.resume_steps,
               " with --resume must be at least the ", done, " steps done (and more than the ", sched.warmup_steps,
               " warmup steps)");
      o.steps = sched.total_steps = in.resume_steps;
      config["steps"] = config["schedule"]["total_steps"] = in.resume_steps;
      run.write_config(config);
    }
  } else {
    check_options(o);
    cfg = o.model ? *o.model : GPTConfig::named(o.config);
    cfg.validate();
    sched = o.schedule(o.steps);
    if (!o.plan.empty()) {  // --plan: the techniques come from the planner
      const RunPlan plan = plan_run(kCmd, o, run_workload(o, o.model ? "custom" : o.config, cfg, std::nullopt));
      apply_plan(plan, o);  // techniques, optimizer (adam8bit), split: config.json records them
      config = make_config(o, cfg, prepare_data(run, o.data, data_note), sched);
      config["plan"] = plan.to_json();
    } else {
      config = make_config(o, cfg, prepare_data(run, o.data, data_note), sched);
    }
    run.write_config(config);
  }
  const int64_t T = cfg.context, B = o.batch;

  // Data: random training windows from the first 90%, fixed validation windows from the rest.
  auto file = std::make_shared<const TokenFile>(token_file_of(run, config.at("data")));
  auto [train_region, val_region] = split_train_val(file->size(), config["data"].value("val_fraction", kValFraction));
  auto train_set = std::make_shared<TokenWindowDataset>(
      file, TokenWindowOptions{.context = T, .region = train_region, .seed = derive_seed(o.seed, {kDataKey})});
  auto val_set = validation_windows(file, val_region, T, o.eval_windows);

  const std::optional<Calibration> rates = planning_rates(o, device);  // before the budget: measuring allocates
  if (!o.parallel.active()) set_memory_limits(o.memory_limit, {device});  // else per device, once placed
  Generator init_gen(derive_seed(o.seed, {kInitKey}));
  GPT model(cfg, {.gen = &init_gen, .device = device});
  if (!resuming && !o.init_from.empty()) model.load_hf_gpt2(o.init_from);
  const Precision precision = o.techniques.precision;
  apply_precision(model, precision);  // bf16-pure: bf16 parameters, f32 masters in the optimizer
  model.set_checkpoint(o.techniques.checkpoint);
  if (resuming) o.parallel.validate(kCmd, o.techniques.micro_batch, o.techniques.auto_fit,
                                    o.techniques.offload_activations.has_value());
  const std::optional<ModelParallelRun> parallel =
      place_model(o.parallel, model, gpt_probe(cfg, o), o.memory_limit, B, o.techniques.micro_batch);
  const Device data_device = parallel ? parallel->input_device() : device;  // tokens and targets (wte's device)
  DataLoader loader(train_set, sharded(o, {.batch_size = B, .drop_last = true, .prefetch = 2, .device = data_device}));

  GptTrainResult r;
  r.config = cfg;
  r.last_val_loss = std::nan("");
  r.unigram_entropy = unigram_entropy(*file, val_region);
  TrainingTask task;
  task.command = kCmd;
  task.unit = "tok/s";
  task.items_per_example = T;
  task.eval_column = "val_loss";
  if (!data_note.empty()) task.notes.push_back(data_note);
  if (!o.init_from.empty() && !resuming) task.notes.push_back("starting from the weights of " + o.init_from);
  char entropy_note[160];
  std::snprintf(entropy_note, sizeof(entropy_note),
                "validation split: %lld tokens, unigram entropy %.4f nats/token (the loss of a context-free model)",
                (long long)(val_region.end - val_region.begin), r.unigram_entropy);
  task.notes.push_back(entropy_note);
  task.header = config.value("model_name", "custom") + " (" + std::to_string(model.num_parameters()) +
                " parameters), batch " + std::to_string(B) + " x " + std::to_string(T) + " tokens";
  task.micro_loss = [&](const Batch& b, int64_t begin, int64_t n) {
    return model.loss(narrow(b.input, 0, begin, n), narrow(b.target, 0, begin, n));
  };
  task.micro_weight = [](const Batch& b, int64_t begin, int64_t n) { return counted_targets(b.target, begin, n); };
  task.evaluate = [&](int64_t step, int64_t micro) -> std::optional<Evaluation> {
    if (step % o.eval_every != 0 && step != o.steps) return std::nullopt;
    r.last_val_loss = validation_loss(model, val_set, micro > 0 ? micro : B, data_device, precision);
    char line[96];
    std::snprintf(line, sizeof(line), "step %lld/%lld: validation loss %.4f (%lld windows)", (long long)step,
                  (long long)o.steps, r.last_val_loss, (long long)val_set->size());
    return Evaluation{r.last_val_loss, line};
  };
  task.checkpoint_due = [&](int64_t step) { return step % o.checkpoint_every == 0; };
  task.set_checkpoint = [&](const CheckpointPolicy& c) { model.set_checkpoint(c); };
  if (config.contains("plan")) task.notes.push_back("plan: " + config["plan"].value("summary", std::string("?")));
  std::optional<AutoFit> auto_fit;
  if (o.techniques.auto_fit && rates)
    auto_fit.emplace(run_workload(o, config.value("model_name", "custom"), cfg, std::nullopt), device, *rates,
                     auto_fit_placement(o.parallel, parallel ? &*parallel : nullptr));
  task.pipeline_stages = [&](const Batch& b, const std::vector<int64_t>& stage_blocks, int64_t micro) {
    return gpt_pipeline_stages(model, stage_blocks, b.input, b.target, micro);
  };
  task.progress_extra = [&](int64_t, double lr) {  // validation results get lines of their own
    char extra[32];
    std::snprintf(extra, sizeof(extra), "lr %.2e", lr);
    return std::string(extra);
  };
  static_cast<TrainResult&>(r) = train_loop({.options = o, .device = device, .run = run, .model = model,
                                             .loader = loader, .schedule = sched, .total_steps = o.steps,
                                             .resuming = resuming, .dropout_seed = derive_seed(o.seed, {kDropoutKey}),
                                             .parallel = parallel ? &*parallel : nullptr,
                                             .auto_fit = auto_fit ? &*auto_fit : nullptr},
                                            task);
  r.tokens_per_s = r.items_per_s;
  return r;
}

namespace {

// Whether `dir` is a quantized run (memgrad quantize): a config with a "quantized" section.
bool is_quantized_run(const std::string& dir) {
  RunDir q(dir);
  return q.has_config() && q.read_config().contains(kQuantizedConfigKey);
}

// The int8 GPT of a quantized run, loaded from its file.
std::shared_ptr<GPT> load_quantized_gpt(const RunDir& run, const nlohmann::json& config, Device device,
                                        std::string* scheme, const char* cmd) {
  const nlohmann::json& q = config.at(kQuantizedConfigKey);
  LoadedQuantizedModel l = load_quantized(run.file(q.value("file", std::string(kQuantizedModelFile))), device);
  auto model = std::dynamic_pointer_cast<GPT>(l.model);
  MG_CHECK(model, cmd, ": the quantized model of '", run.path(), "' is a ", l.info.model, ", not a GPT");
  if (scheme) *scheme = l.info.scheme;
  return model;
}

}  // namespace

GptEvalResult gpt_eval(const GptEvalOptions& o) {
  constexpr const char* cmd = "gpt eval";
  const bool quantized = is_quantized_run(o.run);
  RunDir run = quantized ? RunDir(o.run) : existing_run_dir(o.run, cmd);  // a quantized run has no checkpoint
  const nlohmann::json config = run.read_config();
  MG_CHECK(config.value("command", "") == kCmd, cmd, ": '", o.run, "' is a '", config.value("command", "?"),
           "' run, not a gpt train run");
  MG_CHECK(o.windows >= 0 && o.batch >= 0, cmd, ": --windows and --batch must be >= 0");
  const GPTConfig cfg = GPTConfig::from_json(config.at("model"));
  const Device device = open_device(o.device, "");
  std::shared_ptr<const TokenFile> file;
  TokenRegion region;
  if (o.data.empty()) {
    file = std::make_shared<const TokenFile>(token_file_of(run, config.at("data")));
    region = split_train_val(file->size(), config["data"].value("val_fraction", kValFraction)).second;
  } else {
    MG_CHECK(fs::is_regular_file(o.data), cmd, ": --data '", o.data, "' is not a file");
    std::string path = o.data;
    if (!is_token_file(o.data)) {  // text: tokenized next to the run's files, once
      path = run.file("eval-" + fs::path(o.data).filename().string() + ".tokens");
      tokenize_files({o.data}, path);
    }
    file = std::make_shared<const TokenFile>(path);
    region = {0, file->size()};
  }
  const int64_t windows = o.windows > 0 ? o.windows : config.value("eval_windows", int64_t(32));
  const int64_t batch = o.batch > 0 ? o.batch : config.value("batch", int64_t(8));
  auto val = validation_windows(file, region, cfg.context, windows);

  GptEvalResult r;
  std::shared_ptr<GPT> model;
  Precision precision = Precision::fp32;  // an int8 model computes in f32
  if (quantized) {
    model = load_quantized_gpt(run, config, device, &r.scheme, cmd);
  } else {
    Generator scratch(0);  // initial values are overwritten by the checkpoint
    model = std::make_shared<GPT>(cfg, InitOptions{.gen = &scratch, .device = device});
    precision = TechniqueOptions{}.from_config(config).precision;
    apply_precision(*model, precision);
    run.load_weights(*model);
    r.sparse_layers = use_sparse_inference(config, *model, o.dense);
  }
  r.weight_bytes = weight_bytes(*model);
  reset_peak_stats(device);
  const auto t0 = std::chrono::steady_clock::now();
  r.loss = validation_loss(*model, val, batch, device, precision);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.peak_bytes = memory_stats(device).allocated.peak;
  r.perplexity = std::exp(r.loss);
  r.windows = val->size();
  r.tokens = r.windows * cfg.context;
  r.tokens_per_s = secs > 0 ? double(r.tokens) / secs : 0.0;
  if (quantized) {
    model.reset();  // the fp32 model's peak without the int8 one beside it
    const nlohmann::json& q = config.at(kQuantizedConfigKey);
    const std::string source = q.value("source_run", std::string());
    if (!source.empty() && RunDir(source).has_config() && !is_quantized_run(source)) {
      const GptEvalResult f = gpt_eval({.run = source, .data = o.data, .windows = windows, .batch = batch,
                                        .device = o.device, .dense = true});
      r.fp32_loss = f.loss;
      r.fp32_weight_bytes = f.weight_bytes;
      r.fp32_tokens_per_s = f.tokens_per_s;
      r.fp32_peak_bytes = f.peak_bytes;
    } else {
      r.fp32_loss = q.value("fp32_val_loss", std::nan(""));
      r.fp32_weight_bytes = q.value("fp32_weight_bytes", int64_t(0));
    }
  }
  return r;
}

int64_t use_sparse_inference(const nlohmann::json& config, GPT& model, bool dense) {
  if (dense || !config.contains("pruning") || !config["pruning"].contains("sparse_weights")) return 0;
  const Tensor& w = model.h->at<Block>(0)->mlp->c_fc->weight;
  if (!w.defined() || !w.device().is_cpu() || w.dtype() != DType::f32) return 0;  // the kernel is f32 on the host
  const SparsifyCounts c = sparsify_gpt(model);
  return c.sparse + c.sparse24;
}

GptSampleResult gpt_sample(const GptSampleOptions& o) {
  const bool quantized = is_quantized_run(o.run);
  RunDir run = quantized ? RunDir(o.run) : existing_run_dir(o.run, "gpt sample");
  const nlohmann::json config = run.read_config();
  MG_CHECK(config.value("command", "") == kCmd, "gpt sample: '", o.run, "' is a '", config.value("command", "?"),
           "' run, not a gpt train run");
  const GPTConfig cfg = GPTConfig::from_json(config.at("model"));
  MG_CHECK(cfg.vocab_size == ByteTokenizer::kVocabSize, "gpt sample: the run's vocabulary has ", cfg.vocab_size,
           " tokens; memgrad samples with the byte tokenizer (", ByteTokenizer::kVocabSize, " tokens)");
  MG_CHECK(!o.prompt.empty(), "gpt sample: --prompt is empty (give at least one character)");
  MG_CHECK(o.tokens >= 0, "gpt sample: --tokens must be >= 0, got ", o.tokens);
  MG_CHECK(o.temperature >= 0, "gpt sample: --temperature must be >= 0, got ", o.temperature);
  MG_CHECK(o.top_k >= 0, "gpt sample: --top-k must be >= 0, got ", o.top_k);
  MG_CHECK(o.top_p > 0 && o.top_p <= 1, "gpt sample: --top-p must be in (0, 1], got ", o.top_p);
  const Device device = open_device(o.device, "");

  std::shared_ptr<GPT> model;
  if (quantized) {
    model = load_quantized_gpt(run, config, device, nullptr, "gpt sample");
  } else {
    Generator scratch(0);  // initial values are overwritten by the checkpoint
    model = std::make_shared<GPT>(cfg, InitOptions{.gen = &scratch, .device = device});
    apply_precision(*model, TechniqueOptions{}.from_config(config).precision);
    const ModelParallelOptions split = ModelParallelOptions::from_json(config.value("model_parallel", nlohmann::json()));
    if (split.split && split.split->kind == SplitSpec::Kind::tensor) {
      // The checkpoint holds the shards: load them into a split twin, then gather them here.
      Generator scratch_tp(0);
      GPT sharded(cfg, {.gen = &scratch_tp, .device = split.devices.front()});
      apply_precision(sharded, TechniqueOptions{}.from_config(config).precision);
      apply_tensor_parallel(sharded, split.devices);
      run.load_weights(sharded);
      model->load_state_dict(gather_tensor_parallel(sharded, device));
    } else {
      run.load_weights(*model);
    }
    use_sparse_inference(config, *model, o.dense);
  }
  model->eval();
  ByteTokenizer tok;
  std::vector<uint32_t> encoded = tok.encode(o.prompt);
  std::vector<int64_t> prompt(encoded.begin(), encoded.end());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> out =
      model->generate(prompt, o.tokens, {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .seed = o.seed});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint32_t> all(out.begin(), out.end());
  GptSampleResult r;
  r.text = tok.decode(all);
  r.continuation = r.text.substr(o.prompt.size());
  r.tokens_per_s = secs > 0 ? double(o.tokens) / secs : 0.0;
  return r;
}

}  // namespace mg
