// GPT training and sampling (see gpt_train.h). One step: the next batch of random windows ->
// loss -> backward -> clip the global gradient norm -> AdamW at the schedule's lr -> drop the
// gradients. Everything random derives from the seed: the weights (their own generator, used
// once), the windows (a pure function of (seed, epoch, index), so the loader's position is all a
// checkpoint needs) and dropout (dropout_generator(), whose state the checkpoint saves).
#include "apps/gpt_train.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "apps/run_dir.h"
#include "apps/train_common.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "data/token_window_dataset.h"
#include "data/tokenizer.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "optim/trainer.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCmd = "gpt train";
constexpr const char* kCacheFile = "data.tokens";  // the tokenized corpus, inside the run dir
constexpr double kValFraction = 0.1;
// Keys that split the seed into independent streams.
constexpr uint64_t kInitKey = 1, kDataKey = 2, kDropoutKey = 3;
const std::vector<std::string> kColumns = {"step", "loss", "val_loss", "lr", "time_s", "peak_bytes"};

bool is_token_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, 8) && std::memcmp(magic, kTokenFileMagic, 8) == 0;
}

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
  return {{"command", kCmd},
          {"model_name", o.model ? std::string("custom") : o.config},
          {"model", cfg.to_json()},
          {"data", data},
          {"optimizer", {{"type", "AdamW"}, {"lr", o.lr}, {"weight_decay", o.weight_decay},
                         {"weight_decay_on", "parameters of rank >= 2"}, {"grad_clip", o.grad_clip}}},
          {"schedule", {{"kind", "cosine"}, {"warmup_steps", sched.warmup_steps},
                        {"total_steps", sched.total_steps}, {"min_lr", sched.min_lr}}},
          {"seed", o.seed}, {"batch", o.batch}, {"steps", o.steps}, {"eval_every", o.eval_every},
          {"eval_windows", o.eval_windows}, {"checkpoint_every", o.checkpoint_every}, {"device", o.device},
          {"techniques", o.techniques.to_json()}};
}

// The run's settings from its config.json (resuming); `o` keeps device, limit, progress, stop_after.
GPTConfig read_config(const nlohmann::json& c, GptTrainOptions& o, LrSchedule& sched) {
  try {
    const auto& opt = c.at("optimizer");
    o.lr = opt.at("lr");
    o.weight_decay = opt.at("weight_decay");
    o.grad_clip = opt.at("grad_clip");
    const auto& s = c.at("schedule");
    sched = LrSchedule::cosine(o.lr, s.at("warmup_steps"), s.at("total_steps"), s.at("min_lr"));
    o.seed = c.at("seed");
    o.batch = c.at("batch");
    o.steps = c.at("steps");
    o.eval_every = c.at("eval_every");
    o.eval_windows = c.at("eval_windows");
    o.checkpoint_every = c.at("checkpoint_every");
    o.techniques = o.techniques.from_config(c);
    return GPTConfig::from_json(c.at("model"));
  } catch (const nlohmann::json::exception& e) {
    MG_THROW(kCmd, ": config.json of '", o.resume, "' is incomplete or malformed: ", e.what());
  }
}

void check_options(const GptTrainOptions& o) {
  MG_CHECK(o.steps > 0, kCmd, ": --steps must be positive, got ", o.steps);
  MG_CHECK(o.batch > 0, kCmd, ": --batch must be positive, got ", o.batch);
  MG_CHECK(o.lr > 0 && std::isfinite(o.lr), kCmd, ": --lr must be a positive number, got ", o.lr);
  MG_CHECK(o.eval_every > 0 && o.checkpoint_every > 0, kCmd, ": --eval-every and --checkpoint-every must be positive");
  MG_CHECK(o.warmup < o.steps, kCmd, ": --warmup (", o.warmup, ") must be smaller than --steps (", o.steps, ")");
  MG_CHECK(o.eval_windows > 0, kCmd, ": eval_windows must be positive, got ", o.eval_windows);
  o.techniques.validate(o.batch, Device(o.device));
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

// Mean loss over the fixed validation windows (eval mode, no graph).
double validation_loss(GPT& model, const std::shared_ptr<const Dataset>& val, int64_t batch, Device device,
                       Precision precision) {
  NoGradGuard no_grad;
  AutocastGuard autocast(precision == Precision::fp16 ? DType::f16 : DType::bf16,
                         precision == Precision::fp16 || precision == Precision::bf16);
  model.eval();
  DataLoader loader(val, {.batch_size = batch, .prefetch = 0, .device = device});
  double sum = 0.0;
  int64_t n = 0;
  while (auto b = loader.next()) {
    sum += model.loss(b->input, b->target).item() * double(b->size());
    n += b->size();
  }
  model.train();
  return sum / double(n);
}

}  // namespace

GptTrainResult gpt_train(const GptTrainOptions& in) {
  GptTrainOptions o = in;
  const bool resuming = !o.resume.empty();
  const Device device = open_device(o.device, o.memory_limit);
  RunDir run = resuming ? resume_run_dir(o.resume, kCmd)
                        : new_run_dir(o.out, o.model ? "gpt" : o.config, kCmd);
  std::string data_note;

  GPTConfig cfg;
  LrSchedule sched;
  nlohmann::json config;
  if (resuming) {
    config = run.read_config();
    cfg = read_config(config, o, sched);
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
    const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
    sched = LrSchedule::cosine(o.lr, warmup, o.steps, o.lr * o.min_lr_ratio);
    config = make_config(o, cfg, prepare_data(run, o.data, data_note), sched);
    run.write_config(config);
  }
  const int64_t T = cfg.context, B = o.batch;

  // Data: random training windows from the first 90%, fixed validation windows from the rest.
  auto file = std::make_shared<const TokenFile>(token_file_of(run, config.at("data")));
  auto [train_region, val_region] = split_train_val(file->size(), config["data"].value("val_fraction", kValFraction));
  auto train_set = std::make_shared<TokenWindowDataset>(
      file, TokenWindowOptions{.context = T, .region = train_region, .seed = derive_seed(o.seed, {kDataKey})});
  const int64_t val_available = (val_region.end - val_region.begin - 1) / T;
  MG_CHECK(val_available >= 1, kCmd, ": the validation split of '", file->path(), "' (", val_region.end - val_region.begin,
           " tokens) is shorter than one window of ", T + 1, " tokens\n  hint: use more text or a smaller context");
  auto val_set = std::make_shared<TokenWindowDataset>(
      file, TokenWindowOptions{.context = T, .region = val_region, .random = false,
                               .samples_per_epoch = std::min(o.eval_windows, val_available)});
  DataLoader loader(train_set, {.batch_size = B, .drop_last = true, .prefetch = 2, .device = device});

  Generator init_gen(derive_seed(o.seed, {kInitKey}));
  GPT model(cfg, {.gen = &init_gen, .device = device});
  const Precision precision = parse_precision(o.techniques.precision);
  apply_precision(model, precision);  // bf16-pure: bf16 parameters, f32 masters in the optimizer
  model.set_checkpoint(o.techniques.checkpoint_policy());
  AdamW opt(weight_decay_groups(model.named_parameters(), o.lr, o.weight_decay));
  Trainer trainer(model, opt, o.techniques.trainer_options(o.grad_clip));
  TrainingState state;
  if (resuming) {
    state = run.load_checkpoint(model, &opt);
    MG_CHECK(state.generators.count("dropout"), kCmd, ": the checkpoint of '", run.path(),
             "' has no dropout generator state");
    state.generators.at("dropout").restore(dropout_generator());
    loader.set_position(state.position);
    if (!state.trainer.empty()) trainer.load_state(state.trainer);
  } else {
    dropout_generator().manual_seed(derive_seed(o.seed, {kDropoutKey}));
  }
  MetricsWriter metrics(run.metrics_path(), kColumns, resuming ? state.step : -1);

  GptTrainResult r;
  r.run_dir = run.path();
  r.first_step = state.step;
  r.num_parameters = model.num_parameters();
  r.config = cfg;
  r.last_val_loss = std::nan("");
  Progress progress("gpt train", o.steps, "tok/s", o.progress);
  if (!data_note.empty()) progress.note(data_note);
  r.unigram_entropy = unigram_entropy(*file, val_region);
  char entropy_note[160];
  std::snprintf(entropy_note, sizeof(entropy_note),
                "validation split: %lld tokens, unigram entropy %.4f nats/token (the loss of a context-free model)",
                (long long)(val_region.end - val_region.begin), r.unigram_entropy);
  progress.note(entropy_note);
  progress.note("gpt train: " + config.value("model_name", "custom") + " (" + std::to_string(r.num_parameters) +
                " parameters), batch " + std::to_string(B) + " x " + std::to_string(T) + " tokens, " + sched.str() +
                ", techniques: " + o.techniques.str() + ", on " + device.str() +
                (resuming ? ", resuming at step " + std::to_string(state.step) : "") + " -> " + run.path());

  PeakMeter meter(device, state.peak_bytes);
  StepTimes times;
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return state.elapsed_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  InterruptGuard interrupt;
  StepProfiler step_profiler(o.techniques, device, state.step, o.steps);
  int64_t step = state.step;
  while (step < o.steps) {
    if (o.stop_after >= 0 && step >= o.stop_after) break;
    const double lr = sched(step);
    step_profiler.before_step(step);
    times.start();
    meter.begin_step();
    Batch batch = loader.next_step();  // (B, T) inputs and next-token targets
    opt.set_lr(lr);
    const StepReport rep = trainer.step(batch.size(), [&](int64_t b, int64_t n) {
      return model.loss(narrow(batch.input, 0, b, n), narrow(batch.target, 0, b, n));
    });
    const double loss_value = rep.loss;
    if (rep.retries > 0)
      progress.note("auto-fit: step " + std::to_string(step + 1) + " ran out of memory; retried with micro-batch " +
                    std::to_string(rep.micro_batch) + " (" + std::to_string(rep.micro_steps) + " micro-steps)");
    const int64_t step_peak = meter.end_step();
    const double secs = times.stop();
    if (std::string line = step_profiler.after_step(step, run.path()); !line.empty()) progress.note(line);
    ++step;

    std::string val_cell;
    if (step % o.eval_every == 0 || step == o.steps) {
      r.last_val_loss = validation_loss(model, val_set, B, device, precision);
      val_cell = csv_number(r.last_val_loss);
    }
    metrics.write({csv_number(step - 1), csv_number(loss_value), val_cell, csv_number(lr), csv_number(elapsed()),
                   csv_number(step_peak)});
    r.last_loss = loss_value;
    char extra[64];
    std::snprintf(extra, sizeof(extra), std::isnan(r.last_val_loss) ? "lr %.2e" : "lr %.2e  val %.4f", lr,
                  r.last_val_loss);
    progress.update({.done = step, .loss = loss_value, .throughput = double(B * T) / secs,
                     .allocated = meter.allocated(), .peak = meter.run_peak(), .limit = meter.limit(),
                     .extra = extra});
    r.interrupted = interrupt.raised() && step < o.steps;
    if (step % o.checkpoint_every == 0 || step == o.steps || r.interrupted) {
      run.save_checkpoint(model, opt, {.step = step, .position = loader.position(),
                                       .generators = {{"dropout", GeneratorState::of(dropout_generator())}},
                                       .elapsed_s = elapsed(), .peak_bytes = meter.run_peak(),
                                       .trainer = trainer.state()});
    }
    if (r.interrupted) break;
  }
  progress.finish();
  r.steps_done = step;
  r.ms_per_step = 1000.0 * times.median();
  r.tokens_per_s = times.count() ? double(B * T) / times.median() : 0.0;
  r.peak_bytes = meter.run_peak();
  r.memory = StepMemory::of(meter);
  r.micro_batch = trainer.micro_batch();
  r.skipped_steps = trainer.scaler() ? trainer.scaler()->skipped_steps() : 0;
  return r;
}

GptSampleResult gpt_sample(const GptSampleOptions& o) {
  RunDir run = existing_run_dir(o.run, "gpt sample");
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
  const Device device = open_device(o.device, "");

  Generator scratch(0);  // initial values are overwritten by the checkpoint
  GPT model(cfg, {.gen = &scratch, .device = device});
  apply_precision(model, parse_precision(TechniqueOptions{}.from_config(config).precision));
  run.load_weights(model);
  model.eval();
  ByteTokenizer tok;
  std::vector<uint32_t> encoded = tok.encode(o.prompt);
  std::vector<int64_t> prompt(encoded.begin(), encoded.end());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> out =
      model.generate(prompt, o.tokens, {.temperature = o.temperature, .top_k = o.top_k, .seed = o.seed});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint32_t> all(out.begin(), out.end());
  GptSampleResult r;
  r.text = tok.decode(all);
  r.continuation = r.text.substr(o.prompt.size());
  r.tokens_per_s = secs > 0 ? double(o.tokens) / secs : 0.0;
  return r;
}

}  // namespace mg
