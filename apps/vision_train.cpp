// MobileNetV2 training and evaluation (see vision_train.h). Training plugs MobileNetV2's parts into
// the shared loop (apps/training_loop.h): shuffled batches (N, 3, S, S) of images, cross-entropy
// of the logits, test accuracy after every epoch. The shuffling order and the augmentations are
// pure functions of (seed, epoch, index), so a checkpoint needs only the loader's position;
// BatchNorm's running statistics are buffers and travel in model.safetensors.
#include "apps/vision_train.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "apps/ddp_setup.h"
#include "apps/quantize.h"
#include "apps/run_dir.h"
#include "apps/run_plan.h"
#include "apps/run_setup.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "data/data_loader.h"
#include "data/fashion_mnist.h"
#include "data/image_folder.h"
#include "data/transforms.h"
#include "models/compress/distillation.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "models/nn/batch_norm_stats.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "optim/trainer.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCmd = "vision train";
constexpr uint64_t kInitKey = 1, kShuffleKey = 2, kAugmentKey = 3, kDropoutKey = 4;

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
  const auto params = model.features->parameters();
  if (params.empty()) return x;  // a quantized model: int8 buffers, f32 inputs
  const DType d = params[0].dtype();
  return x.dtype() == d ? x : cast(x, d);
}

// Before every evaluation, BatchNorm's running statistics are recomputed as the plain average over
// this many training batches under the current weights (models/nn/batch_norm_stats.h: the decayed
// average of an early run gives below-chance test accuracy). Dropout's stream is put back after,
// so training draws the same masks as without the evaluation.
constexpr int64_t kBatchNormBatches = 20;

int64_t recompute_statistics(MobileNetV2& model, const std::shared_ptr<const Dataset>& train, int64_t batch,
                             Device device, Precision precision) {
  DataLoader loader(train, {.batch_size = batch, .prefetch = 0, .device = device});
  const int64_t n = std::min<int64_t>(kBatchNormBatches, loader.batches_per_epoch());
  const GeneratorState dropout = GeneratorState::of(dropout_generator());
  AutocastGuard autocast(autocast_for(precision));
  recompute_batch_norm_stats(model, n, [&](int64_t) { model.forward(model_input(model, loader.next()->input)); });
  dropout.restore(dropout_generator());
  return n;
}

double accuracy(MobileNetV2& model, const std::shared_ptr<const Dataset>& test, int64_t batch, Device device,
                double* images_per_s = nullptr, Precision precision = Precision::fp32) {
  NoGradGuard no_grad;
  AutocastGuard autocast(autocast_for(precision));
  EvalGuard eval_mode(model);
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
  return double(right) / double(n);
}

// A trained vision run's MobileNetV2 on `device` with its own precision, its BatchNorm statistics
// recomputed over `train` (its training images), in eval mode: what `vision eval` measures and
// what a distilled fine-tune learns from.
struct TrainedMobileNet {
  std::unique_ptr<MobileNetV2> model;
  Precision precision = Precision::fp32;
};

TrainedMobileNet load_trained(const RunDir& run, const nlohmann::json& config, Device device,
                              const std::shared_ptr<const Dataset>& train, int64_t batch) {
  Generator scratch(0);  // initial values are overwritten by the checkpoint
  TrainedMobileNet t{std::make_unique<MobileNetV2>(MobileNetV2Config::from_json(config.at("model")),
                                                    InitOptions{.gen = &scratch, .device = device}),
                     TechniqueOptions{}.from_config(config).precision};
  apply_precision(*t.model, t.precision);
  run.load_weights(*t.model);
  recompute_statistics(*t.model, train, batch, device, t.precision);
  t.model->eval();
  return t;
}

// The teacher of a distilled run (config.json's "distill": {"teacher": run dir, "weight",
// "temperature"}, written by `memgrad prune --distill`): the run it was pruned from.
TrainedMobileNet load_teacher(const nlohmann::json& distill, const MobileNetV2Config& student, Device device,
                              const std::shared_ptr<const Dataset>& train, int64_t batch) {
  const std::string path = distill.at("teacher").get<std::string>();
  RunDir run = existing_run_dir(path, "vision train (the distillation teacher)");
  const nlohmann::json config = run.read_config();
  MG_CHECK(config.value("command", "") == kCmd, kCmd, ": the distillation teacher '", path, "' is a '",
           config.value("command", "?"), "' run, not a vision train run");
  const MobileNetV2Config cfg = MobileNetV2Config::from_json(config.at("model"));
  MG_CHECK(cfg.num_classes == student.num_classes && cfg.input_size == student.input_size, kCmd,
           ": the distillation teacher '", path, "' has ", cfg.num_classes, " classes at ", cfg.input_size,
           "x", cfg.input_size, ", the student ", student.num_classes, " at ", student.input_size, "x",
           student.input_size);
  return load_trained(run, config, device, train, batch);
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

// One training step of this run's model on meta, for --split balanced: the run's precision,
// checkpointing and optimizer, one micro-batch's activations.
StepProbe vision_probe(const MobileNetV2Config& cfg, const VisionTrainOptions& o) {
  const int64_t rows = o.techniques.micro_batch > 0 ? o.techniques.micro_batch : o.batch;
  return with_run_techniques<MobileNetV2>(mobilenet_step_probe(cfg, rows, cfg.input_size, [&o](Module& m) { return make_optimizer(o, m); }),
                                 o.techniques);
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
    // Only the images the run uses are read, into the host data pool (not the training device).
    MG_CHECK(limit_train >= 0 && limit_test >= 0, "vision: --limit-train / --limit-test must be >= 0");
    train = std::make_shared<FashionMnistDataset>(kFashionMnistDir, FashionMnistSplit::train, kHostData, limit_train);
    test = std::make_shared<FashionMnistDataset>(kFashionMnistDir, FashionMnistSplit::test, kHostData, limit_test);
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
  prepare_data_parallel(o, kCmd);  // --ddp: this rank's device, run directory and output
  const bool resuming = !o.resume.empty();
  // The model is built on --device; a split one is then placed on its devices (place_model).
  // Budgets are set once the run's devices are known (a resumed run's come from config.json).
  const Device device = open_device(o.device, "");
  RunDir run = resuming ? resume_run_dir(o.resume, kCmd) : new_run_dir(o.out, o.config ? "vision" : o.model, kCmd);
  nlohmann::json config;
  MobileNetV2Config cfg;
  LrSchedule sched;
  if (resuming) {
    config = run.read_config();
    sched = o.read_config(config, kCmd);
    try {
      cfg = MobileNetV2Config::from_json(config.at("model"));
      const auto& dj = config.at("data");
      o.data = dj.at("source");
      o.augment = dj.at("augment");
      o.limit_train = dj.at("limit_train");
      o.limit_test = dj.at("limit_test");
      o.epochs = config.at("epochs");
    } catch (const nlohmann::json::exception& e) {
      MG_THROW(kCmd, ": config.json of '", o.resume, "' is incomplete or malformed: ", e.what());
    }
  } else {
    o.validate(kCmd);
    MG_CHECK(o.epochs > 0, kCmd, ": --epochs must be positive, got ", o.epochs);
    cfg = o.config ? *o.config : MobileNetV2Config::named(o.model);  // validates the name early
  }
  o.techniques.validate(o.batch, device);
  o.parallel.validate(kCmd, o.techniques.micro_batch, o.techniques.auto_fit, o.techniques.offload_activations.has_value(),
                      !o.plan.empty());
  MG_CHECK(!(o.parallel.split && o.parallel.split->kind == SplitSpec::Kind::tensor), kCmd,
           ": --split tensor slices a GPT's attention heads and MLP; split MobileNetV2 with --split stages:K or balanced");
  MG_CHECK(!o.parallel.pipeline, kCmd, ": --pipeline runs GPT stages only (gpt train); split MobileNetV2 with --split "
                                   "stages:K or balanced without it");
  const int64_t size = o.input_size > 0 && !resuming ? o.input_size : cfg.input_size;
  VisionData data = load_vision_data(o.data, size, o.augment, o.seed, o.limit_train, o.limit_test);

  const int64_t per_epoch = data.train->size() / o.batch;  // the loader drops the last partial batch
  MG_CHECK(per_epoch > 0, kCmd, ": the training set has ", data.train->size(), " images, fewer than --batch ", o.batch,
           ", so an epoch has no batch");
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
    sched = o.schedule(total);
    config = {{"command", kCmd},
              {"model_name", o.config ? std::string("custom") : o.model},
              {"model", cfg.to_json()},
              {"data", {{"source", data.source}, {"split", data.split}, {"augment", o.augment},
                        {"limit_train", o.limit_train}, {"limit_test", o.limit_test},
                        {"train_examples", data.train->size()}, {"test_examples", data.test->size()}}},
              {"epochs", o.epochs}, {"steps_per_epoch", per_epoch}};
    if (!o.plan.empty()) {  // --plan: the techniques come from the planner
      const RunPlan plan = plan_run(kCmd, o, run_workload(o, o.config ? "custom" : o.model, std::nullopt, cfg));
      apply_plan(plan, o);  // techniques, optimizer (adam8bit), split: config.json records them
      config["plan"] = plan.to_json();
    }
    config.update(o.to_config(sched));
    run.write_config(config);
  }
  const int64_t total_steps = o.epochs * per_epoch;

  const std::optional<Calibration> rates = planning_rates(o, device);  // before the budget: measuring allocates
  if (!o.parallel.active()) set_memory_limits(o.memory_limit, {device});  // else per device, once placed
  Generator init_gen(derive_seed(o.seed, {kInitKey}));
  MobileNetV2 model(cfg, {.gen = &init_gen, .device = device});
  const Precision precision = o.techniques.precision;
  apply_precision(model, precision);
  model.set_checkpoint(o.techniques.checkpoint);
  const std::optional<ModelParallelRun> parallel =
      place_model(o.parallel, model, vision_probe(cfg, o), o.memory_limit, o.batch, o.techniques.micro_batch);
  const Device data_device = parallel ? parallel->input_device() : device;     // images: the stem's device
  const Device label_device = parallel ? parallel->output_device() : device;   // labels: the classifier's
  DataLoader loader(data.train, sharded(o, {.batch_size = o.batch, .shuffle = true, .seed = derive_seed(o.seed, {kShuffleKey}),
                                            .drop_last = true, .prefetch = 2, .device = data_device}));
  MG_INTERNAL_ASSERT(loader.batches_per_epoch() == per_epoch, "vision train: ", loader.batches_per_epoch(),
                     " batches per epoch, expected ", per_epoch);

  VisionTrainResult r;
  r.steps_per_epoch = per_epoch;
  r.train_examples = data.train->size();
  r.test_examples = data.test->size();
  r.config = cfg;
  r.test_accuracy = std::nan("");
  TrainingTask task;
  task.command = kCmd;
  task.unit = "img/s";
  task.eval_column = "test_accuracy";
  task.header = config.value("model_name", "custom") + " (" + std::to_string(model.num_parameters()) +
                " parameters, " + std::to_string(cfg.input_size) + "x" + std::to_string(cfg.input_size) + " input), " +
                std::to_string(r.train_examples) + " training / " + std::to_string(r.test_examples) + " test images of " +
                data.source + ", batch " + std::to_string(o.batch);
  // A distilled fine-tune (memgrad prune --distill) also matches its teacher's soft targets.
  std::optional<TrainedMobileNet> teacher;
  DistillationOptions distill;
  if (config.contains("distill")) {
    MG_CHECK(!parallel, kCmd, ": a distilled run trains on one device (its teacher runs beside it); drop the split");
    distill = DistillationOptions::from_json(config["distill"]);
    distill.validate(kCmd);
    teacher = load_teacher(config["distill"], cfg, device, data.train, o.batch);
    char line[96];
    std::snprintf(line, sizeof(line), ", weight %g, temperature %g", distill.weight, distill.temperature);
    task.notes.push_back("distillation: teacher " + config["distill"].at("teacher").get<std::string>() + line);
  }
  task.micro_loss = [&](const Batch& b, int64_t begin, int64_t n) {
    const Tensor x = narrow(b.input, 0, begin, n), y = to(narrow(b.target, 0, begin, n), label_device);
    if (!teacher) return cross_entropy(model.forward(model_input(model, x)), y);
    Tensor soft;  // first, while the student has saved nothing: its activations come and go alone
    {
      NoGradGuard no_grad;
      soft = teacher->model->forward(model_input(*teacher->model, x));
    }
    return distillation_loss(model.forward(model_input(model, x)), soft, y, distill);
  };
  task.evaluate = [&](int64_t step, int64_t micro) -> std::optional<Evaluation> {
    if (step % per_epoch != 0) return std::nullopt;  // test accuracy after every epoch
    // The statistics over batches of o.batch (what BatchNorm's running statistics stand for);
    // the accuracy, whose eval-mode forward does not depend on the batch, at most micro at once.
    const int64_t bn_batches = recompute_statistics(model, data.train, o.batch, data_device, precision);
    r.test_accuracy = accuracy(model, data.test, micro > 0 ? micro : o.batch, data_device, nullptr, precision);
    char line[160];
    std::snprintf(line, sizeof(line),
                  "epoch %lld/%lld: test accuracy %.2f%% (%lld images; BatchNorm statistics of %lld training batches)",
                  (long long)(step / per_epoch), (long long)o.epochs, 100.0 * r.test_accuracy,
                  (long long)r.test_examples, (long long)bn_batches);
    return Evaluation{r.test_accuracy, line};
  };
  task.checkpoint_due = [&](int64_t step) {
    return o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : step % per_epoch == 0;
  };
  task.set_checkpoint = [&](const CheckpointPolicy& c) { model.set_checkpoint(c); };
  if (config.contains("plan")) task.notes.push_back("plan: " + config["plan"].value("summary", std::string("?")));
  std::optional<AutoFit> auto_fit;
  if (o.techniques.auto_fit && rates)
    auto_fit.emplace(run_workload(o, config.value("model_name", "custom"), std::nullopt, cfg), device, *rates,
                     auto_fit_placement(o.parallel, parallel ? &*parallel : nullptr));
  task.progress_extra = [&](int64_t step, double lr) {
    char extra[64];
    std::snprintf(extra, sizeof(extra), "epoch %lld/%lld  lr %.2e", (long long)((step - 1) / per_epoch + 1),
                  (long long)o.epochs, lr);
    return std::string(extra);
  };
  static_cast<TrainResult&>(r) = train_loop({.options = o, .device = device, .run = run, .model = model,
                                             .loader = loader, .schedule = sched, .total_steps = total_steps,
                                             .resuming = resuming, .dropout_seed = derive_seed(o.seed, {kDropoutKey}),
                                             .parallel = parallel ? &*parallel : nullptr,
                                             .auto_fit = auto_fit ? &*auto_fit : nullptr},
                                            task);
  r.images_per_s = r.items_per_s;
  return r;
}

// The int8 model of a quantized run (memgrad quantize): no BatchNorm is left to recompute.
VisionEvalResult eval_quantized(const VisionEvalOptions& o, const RunDir& run, const nlohmann::json& config) {
  const nlohmann::json& q = config.at(kQuantizedConfigKey);
  const Device device = open_device(o.device, "");
  const LoadedQuantizedModel l = load_quantized(run.file(q.value("file", std::string(kQuantizedModelFile))), device);
  auto* model = dynamic_cast<MobileNetV2*>(l.model.get());
  MG_CHECK(model, "vision eval: the quantized model of '", o.run, "' is a ", l.info.model, ", not a MobileNetV2");
  const auto& dj = config.at("data");
  const std::string source = o.data.empty() ? dj.at("source").get<std::string>() : o.data;
  const int64_t limit = o.limit_test >= 0 ? o.limit_test : dj.value("limit_test", int64_t(0));
  const int64_t batch = o.batch > 0 ? o.batch : config.value("batch", int64_t(64));
  VisionData data = load_vision_data(source, model->config().input_size, false, 0, batch, limit);
  MG_CHECK(data.num_classes == model->config().num_classes, "vision eval: --data '", source, "' has ", data.num_classes,
           " classes, the run's model ", model->config().num_classes);
  VisionEvalResult r;
  r.scheme = l.info.scheme;
  r.weight_bytes = weight_bytes(*model);
  r.fp32_accuracy = q.value("fp32_accuracy", std::nan(""));
  r.fp32_weight_bytes = q.value("fp32_weight_bytes", int64_t(0));
  reset_peak_stats(device);
  r.accuracy = accuracy(*model, data.test, batch, device, &r.images_per_s);
  r.peak_bytes = memory_stats(device).allocated.peak;
  r.examples = data.test->size();
  return r;
}

VisionEvalResult vision_eval(const VisionEvalOptions& o) {
  if (RunDir q(o.run); q.has_config() && q.read_config().contains(kQuantizedConfigKey)) {
    const nlohmann::json config = q.read_config();  // a quantized run has a model file, no checkpoint
    MG_CHECK(config.value("command", "") == kCmd, "vision eval: '", o.run, "' is a quantized '",
             config.value("command", "?"), "' run, not a vision run");
    return eval_quantized(o, q, config);
  }
  RunDir run = existing_run_dir(o.run, "vision eval");
  const nlohmann::json config = run.read_config();
  MG_CHECK(config.value("command", "") == kCmd, "vision eval: '", o.run, "' is a '", config.value("command", "?"),
           "' run, not a vision train run");
  const MobileNetV2Config cfg = MobileNetV2Config::from_json(config.at("model"));
  const auto& dj = config.at("data");
  const std::string source = o.data.empty() ? dj.at("source").get<std::string>() : o.data;
  const int64_t limit = o.limit_test >= 0 ? o.limit_test : dj.value("limit_test", int64_t(0));
  const int64_t batch = o.batch > 0 ? o.batch : config.value("batch", int64_t(64));
  // The run's own training images (as its training saw them) recompute the BatchNorm statistics.
  VisionData data = load_vision_data(source, cfg.input_size, dj.value("augment", false), config.value("seed", uint64_t(1)),
                                     dj.value("limit_train", int64_t(0)), limit);
  MG_CHECK(data.num_classes == cfg.num_classes, "vision eval: --data '", source, "' has ", data.num_classes,
           " classes, the run's model ", cfg.num_classes);
  const Device device = open_device(o.device, "");
  const TrainedMobileNet trained = load_trained(run, config, device, data.train, batch);
  VisionEvalResult r;
  r.weight_bytes = weight_bytes(*trained.model);
  reset_peak_stats(device);
  r.accuracy = accuracy(*trained.model, data.test, batch, device, &r.images_per_s, trained.precision);
  r.peak_bytes = memory_stats(device).allocated.peak;
  r.examples = data.test->size();
  return r;
}

}  // namespace mg
