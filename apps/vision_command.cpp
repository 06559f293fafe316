// `memgrad vision train` and `memgrad vision eval`: the command line over apps/vision_train.h.
// train builds a named MobileNetV2 configuration, trains it on Fashion-MNIST (or an image
// folder) into a run directory and prints loss, test accuracy per epoch, images/s and memory;
// --resume continues a run from its last checkpoint. eval reports a run's test accuracy.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "apps/run_setup.h"
#include "apps/train_flags.h"
#include "apps/vision_train.h"
#include "core/allocator.h"
#include "core/error.h"

namespace mg {
namespace {

void print_train_result(const VisionTrainResult& r) {
  if (r.steps_done == r.first_step) {
    std::printf("vision train: %s is complete (step %lld); nothing to do (give --epochs to train further)\n",
                r.run_dir.c_str(), (long long)r.steps_done);
    return;
  }
  std::printf("vision train: steps %lld..%lld (%lld per epoch)  loss %.4f", (long long)r.first_step,
              (long long)r.steps_done - 1, (long long)r.steps_per_epoch, r.last_loss);
  if (!std::isnan(r.test_accuracy)) std::printf("  test accuracy %.2f%%", 100.0 * r.test_accuracy);
  std::printf("  %.1f ms/step  %.1f images/s (median step)  peak %s\n", r.ms_per_step, r.images_per_s,
              format_bytes(r.peak_bytes).c_str());
  std::printf("run directory: %s (config.json, metrics.csv, checkpoint/)\n", r.run_dir.c_str());
  MG_CHECK(!r.interrupted, "vision train: interrupted after step ", r.steps_done,
           "; the checkpoint is saved, continue with 'memgrad vision train --resume ", r.run_dir, "'");
}

}  // namespace

void add_vision_command(CLI::App& app) {
  CLI::App* vision = app.add_subcommand("vision", "Train MobileNetV2 on images and evaluate it");
  vision->require_subcommand(1);

  auto t = std::make_shared<VisionTrainOptions>();
  CLI::App* train = vision->add_subcommand("train", "Train MobileNetV2 into a run directory (or continue one)");
  // Flags that change the math of a run; with --resume the run's config.json fixes them.
  std::vector<CLI::Option*> fixed = add_train_flags(train, *t, "runs/<model>-<date>-<time>");
  for (CLI::Option* f : {
           train->add_option("--model", t->model, "model configuration: mobilenetv2-32, mobilenetv2-224")
               ->capture_default_str(),
           train->add_option("--data", t->data, "fashion-mnist, or an image folder (<class>/<image>, or train/ + test/)")
               ->capture_default_str(),
           train->add_option("--input-size", t->input_size, "square input size (default: the model's)"),
           train->add_option("--width-mult", t->width_mult, "channel width multiplier (default: the model's)"),
           train->add_flag("--augment", t->augment, "random crop and horizontal flip"),
           train->add_option("--limit-train", t->limit_train, "use the first N training images (0: all)"),
           train->add_option("--limit-test", t->limit_test, "use the first N test images (0: all)"),
       })
    fixed.push_back(f);
  CLI::Option* epochs = train->add_option("--epochs", t->epochs, "epochs (with --resume: a new total)")
                            ->capture_default_str();
  train->callback([t, fixed, epochs] {
    VisionTrainOptions o = *t;
    if (!o.resume.empty()) {
      for (CLI::Option* f : fixed) reject_on_resume(f->count() > 0, f->get_name(), "vision train");
      o.resume_epochs = epochs->count() > 0 ? t->epochs : 0;
    }
    const VisionTrainResult r = vision_train(o);
    if (prints_results(o)) print_train_result(r);  // --ddp: rank 0 only
  });

  auto e = std::make_shared<VisionEvalOptions>();
  CLI::App* eval = vision->add_subcommand("eval", "Report a trained run's test accuracy");
  eval->add_option("--run", e->run, "run directory (from vision train)")->required();
  eval->add_option("--data", e->data, "fashion-mnist or an image folder (default: the run's)");
  eval->add_option("--limit-test", e->limit_test, "use the first N test images (default: the run's; 0: all)");
  eval->add_option("--batch", e->batch, "images per batch (default: the run's)");
  eval->add_option("--device", e->device, "device, e.g. cpu:0")->capture_default_str();
  eval->callback([e] {
    VisionEvalResult r = vision_eval(*e);
    std::printf("vision eval: %s  test accuracy %.2f%% on %lld images  %.1f images/s  weight bytes %lld  peak %lld\n",
                e->run.c_str(), 100.0 * r.accuracy, (long long)r.examples, r.images_per_s, (long long)r.weight_bytes,
                (long long)r.peak_bytes);
    if (!r.scheme.empty())
      std::printf("  %s model; the fp32 run it came from: test accuracy %.2f%%, weight bytes %lld (%.2fx)\n",
                  r.scheme.c_str(), 100.0 * r.fp32_accuracy, (long long)r.fp32_weight_bytes,
                  double(r.fp32_weight_bytes) / double(r.weight_bytes));
  });
}

}  // namespace mg
