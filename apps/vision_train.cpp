// MobileNetV2 training and evaluation (see vision_train.h). One step: the next shuffled batch
// (N, 3, S, S) -> logits -> cross-entropy -> backward -> AdamW at the schedule's lr -> drop the
// gradients. The shuffling order and the augmentations are pure functions of (seed, epoch,
// index), so a checkpoint needs only the loader's position; dropout before the classifier draws
// from dropout_generator(), whose state the checkpoint saves; BatchNorm's running statistics
// are buffers and travel in model.safetensors.
#include "apps/vision_train.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "apps/run_dir.h"
#include "apps/train_common.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "data/fashion_mnist.h"
#include "data/image_folder.h"
#include "data/transforms.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "optim/trainer.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCmd = "vision train";
constexpr uint64_t kInitKey = 1, kShuffleKey = 2, kAugmentKey = 3, kDropoutKey = 4;
const std::vector<std::string> kColumns = {"step", "loss", "test_accuracy", "lr", "time_s", "peak_bytes"};

// The examples `indices` of `base`, renumbered 0..n-1.
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
      : base_(std::move(base)), indices_(std::move(indices)) {}
  int64_t size() const override { return int64_t(indices_.size()); }
  Example get(int64_t index, int64_t epoch = 0) const override { return base_->get(indices_.at(size_t(index)), epoch); }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

// The first `limit` examples of `d` (all when limit is 0 or larger than d).
std::shared_ptr<const Dataset> first_n(std::shared_ptr<const Dataset> d, int64_t limit) {
  MG_CHECK(limit >= 0, kCmd, ": --limit-train / --limit-test must be >= 0, got ", limit);
  if (limit == 0 || limit >= d->size()) return d;
  std::vector<int64_t> idx(static_cast<size_t>(limit));
  for (int64_t i = 0; i < limit; ++i) idx[size_t(i)] = i;
  return std::make_shared<SubsetDataset>(std::move(d), std::move(idx));
}

// u8 (H, W, C) -> resized, [augmented], (3, S, S) f32 normalized.
Transform pipeline(int64_t size, bool augment, const std::vector<float>& mean, const std::vector<float>& std) {
  std::vector<Transform> t = {resize(size)};
  if (augment) {
    t.push_back(random_crop(size, std::max<int64_t>(1, size / 8)));
    t.push_back(random_horizontal_flip());
  }
  t.push_back(to_tensor());
  t.push_back(gray_to_rgb());
  t.push_back(normalize(mean, std));
  return compose(std::move(t));
}

// Inputs in the model's parameter dtype (bf16 for bf16-pure runs; a no-op cast otherwise).
Tensor model_input(const MobileNetV2& model, const Tensor& x) {
  const DType d = model.features->parameters()[0].dtype();
  return x.dtype() == d ? x : cast(x, d);
}

double accuracy(MobileNetV2& model, const std::shared_ptr<const Dataset>& test, int64_t batch, Device device,
                double* images_per_s = nullptr, Precision precision = Precision::fp32) {
  NoGradGuard no_grad;
  AutocastGuard autocast(precision == Precision::fp16 ? DType::f16 : DType::bf16,
                         precision == Precision::fp16 || precision == Precision::bf16);
  const bool was_training = model.is_training();
  model.eval();
  DataLoader loader(test, {.batch_size = batch, .prefetch = 2, .device = device});
  int64_t right = 0, n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (auto b = loader.next()) {
    std::vector<int64_t> pred = argmax(model.forward(model_input(model, b->input)), 1).to_vector<int64_t>();
    std::vector<int64_t> truth = b->target.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) right += pred[i] == truth[i];
    n += b->size();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (images_per_s) *images_per_s = secs > 0 ? double(n) / secs : 0.0;
  model.train(was_training);
  return double(right) / double(n);
}

MobileNetV2Config model_config(const VisionTrainOptions& o, int64_t num_classes) {
  MobileNetV2Config c = o.config ? *o.config : MobileNetV2Config::named(o.model);
  if (o.width_mult > 0) c.width_mult = o.width_mult;
  MG_CHECK(o.input_size >= 0, kCmd, ": --input-size must be positive, got ", o.input_size);
  if (o.input_size > 0) c.input_size = o.input_size;
  c.num_classes = num_classes;
  c.in_channels = 3;
  c.validate();
  return c;
}

}  // namespace

VisionData load_vision_data(const std::string& data, int64_t input_size, bool augment, uint64_t seed,
                            int64_t limit_train, int64_t limit_test) {
  VisionData d;
  std::shared_ptr<const Dataset> train, test;
  std::vector<float> mean, std;
  if (data == "fashion-mnist") {
    MG_CHECK(fs::is_directory(kFashionMnistDir), "vision: Fashion-MNIST is not installed (no ", kFashionMnistDir,
             ")\n  hint: run scripts/setup (Debian package dataset-fashion-mnist), or pass --data with an image folder");
    train = std::make_shared<FashionMnistDataset>(kFashionMnistDir, FashionMnistSplit::train);
    test = std::make_shared<FashionMnistDataset>(kFashionMnistDir, FashionMnistSplit::test);
    d.num_classes = FashionMnistDataset::kNumClasses;
    d.source = data;
    d.split = "fashion-mnist train / t10k";
    mean = {0.2860f};  // Fashion-MNIST's pixel mean and std over the training set
    std = {0.3530f};
  } else {
    MG_CHECK(fs::exists(data), "vision: --data '", data, "' does not exist (give fashion-mnist or an image folder)");
    MG_CHECK(fs::is_directory(data), "vision: --data '", data, "' is not a folder (an image folder has one "
             "subfolder of images per class)");
    d.source = fs::absolute(data).lexically_normal().string();
    const fs::path root(d.source);
    const fs::path test_dir = fs::is_directory(root / "test") ? root / "test" : root / "val";
    if (fs::is_directory(root / "train") && fs::is_directory(test_dir)) {
      auto tr = std::make_shared<ImageFolderDataset>((root / "train").string());
      auto te = std::make_shared<ImageFolderDataset>(test_dir.string());
      MG_CHECK(tr->classes() == te->classes(), "vision: '", (root / "train").string(), "' and '", test_dir.string(),
               "' have different class folders");
      d.num_classes = int64_t(tr->classes().size());
      train = tr;
      test = te;
      d.split = "train/ and " + test_dir.filename().string() + "/ folders";
    } else {
      // One folder: every 10th image (in the folder's stable order) is held out for testing.
      auto all = std::make_shared<ImageFolderDataset>(d.source);
      std::vector<int64_t> tr_idx, te_idx;
      for (int64_t i = 0; i < all->size(); ++i) (i % 10 == 9 ? te_idx : tr_idx).push_back(i);
      MG_CHECK(!te_idx.empty(), "vision: image folder '", d.source, "' has ", all->size(),
               " images; at least 10 are needed to hold every 10th out for testing");
      d.num_classes = int64_t(all->classes().size());
      train = std::make_shared<SubsetDataset>(all, tr_idx);
      test = std::make_shared<SubsetDataset>(all, te_idx);
      d.split = "every 10th image held out";
    }
    mean = {0.485f, 0.456f, 0.406f};  // ImageNet statistics, the usual choice for natural images
    std = {0.229f, 0.224f, 0.225f};
  }
  d.train = std::make_shared<TransformedDataset>(first_n(train, limit_train), pipeline(input_size, augment, mean, std),
                                                 derive_seed(seed, {kAugmentKey}));
  d.test = std::make_shared<TransformedDataset>(first_n(test, limit_test), pipeline(input_size, false, mean, std), 0);
  return d;
}

VisionTrainResult vision_train(const VisionTrainOptions& in) {
  VisionTrainOptions o = in;
  const bool resuming = !o.resume.empty();
  const Device device = open_device(o.device, o.memory_limit);
  RunDir run = resuming ? resume_run_dir(o.resume, kCmd) : new_run_dir(o.out, o.config ? "vision" : o.model, kCmd);
  nlohmann::json config;
  MobileNetV2Config cfg;
  LrSchedule sched;
  if (resuming) {
    config = run.read_config();
    try {
      cfg = MobileNetV2Config::from_json(config.at("model"));
      const auto& dj = config.at("data");
      o.data = dj.at("source");
      o.augment = dj.at("augment");
      o.limit_train = dj.at("limit_train");
      o.limit_test = dj.at("limit_test");
      o.lr = config.at("optimizer").at("lr");
      o.weight_decay = config.at("optimizer").at("weight_decay");
      const auto& s = config.at("schedule");
      sched = LrSchedule::cosine(o.lr, s.at("warmup_steps"), s.at("total_steps"), s.at("min_lr"));
      o.seed = config.at("seed");
      o.batch = config.at("batch");
      o.epochs = config.at("epochs");
      o.checkpoint_every = config.at("checkpoint_every");
      o.techniques = o.techniques.from_config(config);
    } catch (const nlohmann::json::exception& e) {
      MG_THROW(kCmd, ": config.json of '", o.resume, "' is incomplete or malformed: ", e.what());
    }
  }
  MG_CHECK(o.epochs > 0 && o.batch > 0, kCmd, ": --epochs and --batch must be positive, got ", o.epochs, " and ", o.batch);
  MG_CHECK(o.lr > 0 && std::isfinite(o.lr), kCmd, ": --lr must be a positive number, got ", o.lr);
  MG_CHECK(o.checkpoint_every >= 0, kCmd, ": --checkpoint-every must be >= 0, got ", o.checkpoint_every);
  o.techniques.validate(o.batch, device);
  if (!resuming) cfg = o.config ? *o.config : MobileNetV2Config::named(o.model);  // validates the name early
  const int64_t size = o.input_size > 0 && !resuming ? o.input_size : cfg.input_size;
  VisionData data = load_vision_data(o.data, size, o.augment, o.seed, o.limit_train, o.limit_test);

  DataLoader loader(data.train, {.batch_size = o.batch, .shuffle = true, .seed = derive_seed(o.seed, {kShuffleKey}),
                                 .drop_last = true, .prefetch = 2, .device = device});
  const int64_t per_epoch = loader.batches_per_epoch();
  if (resuming) {
    MG_CHECK(config.value("steps_per_epoch", int64_t(-1)) == per_epoch, kCmd, ": the data of '", run.path(),
             "' now gives ", per_epoch, " batches per epoch, the run had ", config.value("steps_per_epoch", int64_t(-1)),
             "; the data changed, so the run cannot continue exactly");
    if (in.resume_epochs > 0 && in.resume_epochs != o.epochs) {  // a new total: the schedule stretches
      const int64_t done = run.read_checkpoint_state().step;
      MG_CHECK(in.resume_epochs * per_epoch >= done && in.resume_epochs * per_epoch > sched.warmup_steps, kCmd,
               ": --epochs ", in.resume_epochs, " with --resume is fewer than the ", done, " steps (of ", per_epoch,
               " per epoch) done");
      o.epochs = in.resume_epochs;
      sched.total_steps = o.epochs * per_epoch;
      config["epochs"] = o.epochs;
      config["schedule"]["total_steps"] = sched.total_steps;
      run.write_config(config);
    }
  } else {
    cfg = model_config(o, data.num_classes);
    const int64_t total = o.epochs * per_epoch;
    MG_CHECK(o.warmup < total, kCmd, ": --warmup (", o.warmup, ") must be smaller than the number of steps (",
             total, " = ", o.epochs, " epochs of ", per_epoch, ")");
    sched = LrSchedule::cosine(o.lr, o.warmup >= 0 ? o.warmup : total / 20, total, o.lr * o.min_lr_ratio);
    config = {{"command", kCmd},
              {"model_name", o.config ? std::string("custom") : o.model},
              {"model", cfg.to_json()},
              {"data", {{"source", data.source}, {"split", data.split}, {"augment", o.augment},
                        {"limit_train", o.limit_train}, {"limit_test", o.limit_test},
                        {"train_examples", data.train->size()}, {"test_examples", data.test->size()}}},
              {"optimizer", {{"type", "AdamW"}, {"lr", o.lr}, {"weight_decay", o.weight_decay},
                             {"weight_decay_on", "parameters of rank >= 2"}}},
              {"schedule", {{"kind", "cosine"}, {"warmup_steps", sched.warmup_steps},
                            {"total_steps", sched.total_steps}, {"min_lr", sched.min_lr}}},
              {"seed", o.seed}, {"batch", o.batch}, {"epochs", o.epochs}, {"steps_per_epoch", per_epoch},
              {"checkpoint_every", o.checkpoint_every}, {"device", o.device},
              {"techniques", o.techniques.to_json()}};
    run.write_config(config);
  }
  const int64_t total_steps = o.epochs * per_epoch;

  Generator init_gen(derive_seed(o.seed, {kInitKey}));
  MobileNetV2 model(cfg, {.gen = &init_gen, .device = device});
  const Precision precision = parse_precision(o.techniques.precision);
  apply_precision(model, precision);
  model.set_checkpoint(o.techniques.checkpoint_policy());
  AdamW opt(weight_decay_groups(model.named_parameters(), o.lr, o.weight_decay));
  Trainer trainer(model, opt, o.techniques.trainer_options(0.0));
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

  VisionTrainResult r;
  r.run_dir = run.path();
  r.first_step = state.step;
  r.steps_per_epoch = per_epoch;
  r.num_parameters = model.num_parameters();
  r.train_examples = data.train->size();
  r.test_examples = data.test->size();
  r.config = cfg;
  r.test_accuracy = std::nan("");
  Progress progress("vision train", total_steps, "img/s", o.progress);
  progress.note("vision train: " + config.value("model_name", "custom") + " (" + std::to_string(r.num_parameters) +
                " parameters, " + std::to_string(cfg.input_size) + "x" + std::to_string(cfg.input_size) + " input), " +
                std::to_string(r.train_examples) + " training / " + std::to_string(r.test_examples) +
                " test images of " + data.source + ", batch " + std::to_string(o.batch) + ", " + sched.str() +
                ", techniques: " + o.techniques.str() + ", on " + device.str() +
                (resuming ? ", resuming at step " + std::to_string(state.step) : "") +
                " -> " + run.path());

  PeakMeter meter(device, state.peak_bytes);
  StepTimes times;
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return state.elapsed_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  model.train();
  InterruptGuard interrupt;
  StepProfiler step_profiler(o.techniques, device, state.step, total_steps);
  int64_t step = state.step;
  while (step < total_steps) {
    if (o.stop_after >= 0 && step >= o.stop_after) break;
    const double lr = sched(step);
    step_profiler.before_step(step);
    times.start();
    meter.begin_step();
    Batch batch = loader.next_step();  // (N, 3, S, S) images, (N) labels
    opt.set_lr(lr);
    const StepReport rep = trainer.step(batch.size(), [&](int64_t b, int64_t n) {
      return cross_entropy(model.forward(model_input(model, narrow(batch.input, 0, b, n))),
                           narrow(batch.target, 0, b, n));
    });
    const double loss_value = rep.loss;
    if (rep.retries > 0)
      progress.note("auto-fit: step " + std::to_string(step + 1) + " ran out of memory; retried with micro-batch " +
                    std::to_string(rep.micro_batch) + " (" + std::to_string(rep.micro_steps) + " micro-steps)");
    const int64_t step_peak = meter.end_step();
    const double secs = times.stop();
    if (std::string line = step_profiler.after_step(step, run.path()); !line.empty()) progress.note(line);
    ++step;

    r.last_loss = loss_value;
    char extra[64];
    std::snprintf(extra, sizeof(extra), "epoch %lld/%lld  lr %.2e", (long long)((step - 1) / per_epoch + 1),
                  (long long)o.epochs, lr);
    progress.update({.done = step, .loss = loss_value, .throughput = double(batch.size()) / secs,
                     .allocated = meter.allocated(), .peak = meter.run_peak(), .limit = meter.limit(), .extra = extra});
    std::string acc_cell;
    const bool epoch_end = step % per_epoch == 0;
    if (epoch_end) {  // test accuracy after every epoch
      r.test_accuracy = accuracy(model, data.test, o.batch, device, nullptr, precision);
      acc_cell = csv_number(r.test_accuracy);
      char line[96];
      std::snprintf(line, sizeof(line), "epoch %lld/%lld: test accuracy %.2f%% (%lld images)",
                    (long long)(step / per_epoch), (long long)o.epochs, 100.0 * r.test_accuracy,
                    (long long)r.test_examples);
      progress.note(line);
    }
    metrics.write({csv_number(step - 1), csv_number(loss_value), acc_cell, csv_number(lr), csv_number(elapsed()),
                   csv_number(step_peak)});
    const bool due = o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : epoch_end;
    r.interrupted = interrupt.raised() && step < total_steps;
    if (due || step == total_steps || r.interrupted)
      run.save_checkpoint(model, opt, {.step = step, .position = loader.position(),
                                       .generators = {{"dropout", GeneratorState::of(dropout_generator())}},
                                       .elapsed_s = elapsed(), .peak_bytes = meter.run_peak(),
                                       .trainer = trainer.state()});
    if (r.interrupted) break;
  }
  progress.finish();
  r.steps_done = step;
  r.ms_per_step = 1000.0 * times.median();
  r.images_per_s = times.count() ? double(o.batch) / times.median() : 0.0;
  r.peak_bytes = meter.run_peak();
  r.memory = StepMemory::of(meter);
  r.micro_batch = trainer.micro_batch();
  r.skipped_steps = trainer.scaler() ? trainer.scaler()->skipped_steps() : 0;
  return r;
}

VisionEvalResult vision_eval(const VisionEvalOptions& o) {
  RunDir run = existing_run_dir(o.run, "vision eval");
  const nlohmann::json config = run.read_config();
  MG_CHECK(config.value("command", "") == kCmd, "vision eval: '", o.run, "' is a '", config.value("command", "?"),
           "' run, not a vision train run");
  const MobileNetV2Config cfg = MobileNetV2Config::from_json(config.at("model"));
  const auto& dj = config.at("data");
  const std::string source = o.data.empty() ? dj.at("source").get<std::string>() : o.data;
  const int64_t limit = o.limit_test >= 0 ? o.limit_test : dj.value("limit_test", int64_t(0));
  const int64_t batch = o.batch > 0 ? o.batch : config.value("batch", int64_t(64));
  VisionData data = load_vision_data(source, cfg.input_size, false, 0, 0, limit);
  MG_CHECK(data.num_classes == cfg.num_classes, "vision eval: --data '", source, "' has ", data.num_classes,
           " classes, the run's model ", cfg.num_classes);
  const Device device = open_device(o.device, "");
  Generator scratch(0);  // initial values are overwritten by the checkpoint
  MobileNetV2 model(cfg, {.gen = &scratch, .device = device});
  const Precision precision = parse_precision(TechniqueOptions{}.from_config(config).precision);
  apply_precision(model, precision);
  run.load_weights(model);
  VisionEvalResult r;
  r.accuracy = accuracy(model, data.test, batch, device, &r.images_per_s, precision);
  r.examples = data.test->size();
  return r;
}

}  // namespace mg
