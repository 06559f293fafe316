// `vision train` / `vision eval` as library calls on a tiny MobileNetV2 (width 0.25, 8x8 input)
// and a tiny image folder: a run interrupted mid-epoch and resumed logs exactly the losses and
// accuracies of an uninterrupted one (shuffling, augmentation, dropout and BatchNorm statistics
// all continue), evaluation reads the run back, and bad flags and paths give clear errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/vision_train.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

VisionTrainOptions resume_options(const std::string& run) {
  VisionTrainOptions o;
  o.resume = run;
  o.progress = ProgressStyle::none;
  return o;
}

VisionTrainOptions tiny_options(const std::string& data, const std::string& out) {
  VisionTrainOptions o;
  o.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8};
  o.data = data;
  o.out = out;
  o.augment = true;
  o.epochs = 2;
  o.batch = 12;
  o.lr = 1e-2;
  o.checkpoint_every = 2;
  o.progress = ProgressStyle::none;
  return o;
}

}  // namespace

TEST_CASE("vision train: an interrupted and resumed run equals the uninterrupted run exactly", "[apps][slow]") {
  DataTempDir tmp("vision_resume");
  // 40 images: every 10th is held out (4 test), 36 train = 3 batches of 12 per epoch, 6 steps.
  const std::string images = write_tiny_image_folder(tmp, 20);

  VisionTrainResult full = vision_train(tiny_options(images, tmp.file("full")));
  CHECK(full.steps_per_epoch == 3);
  CHECK(full.steps_done == 6);
  CHECK(full.train_examples == 36);
  CHECK(full.test_examples == 4);
  CHECK(std::isfinite(full.test_accuracy));

  // Killed after 3 steps (the end of epoch 1): the last checkpoint is at step 2, mid-epoch.
  VisionTrainOptions first = tiny_options(images, tmp.file("split"));
  first.stop_after = 3;
  vision_train(first);
  manual_seed(31337);
  VisionTrainResult rest = vision_train(resume_options(tmp.file("split")));
  CHECK(rest.first_step == 2);
  CHECK(rest.steps_done == 6);

  const std::vector<std::string> losses = metrics_column(tmp.file("full"), "loss");
  REQUIRE(losses.size() == 6);
  CHECK(metrics_column(tmp.file("split"), "loss") == losses);
  const std::vector<std::string> acc = metrics_column(tmp.file("full"), "test_accuracy");
  CHECK(metrics_column(tmp.file("split"), "test_accuracy") == acc);
  CHECK(acc[0].empty());         // accuracy once per epoch: after steps 2 and 5
  CHECK_FALSE(acc[2].empty());
  CHECK_FALSE(acc[5].empty());
  CHECK(rest.test_accuracy == full.test_accuracy);

  // Evaluation rebuilds the model from the run and reproduces the last epoch's accuracy.
  VisionEvalResult ev = vision_eval({.run = tmp.file("full")});
  CHECK(ev.examples == 4);
  CHECK(ev.accuracy == full.test_accuracy);
  const nlohmann::json c = RunDir(tmp.file("full")).read_config();
  CHECK(c.at("steps_per_epoch") == 3);
  CHECK(c.at("model").at("num_classes") == 2);
  CHECK(c.at("data").at("split") == "every 10th image held out");
}

TEST_CASE("vision train: train/ and test/ folders, limits and the input size", "[apps]") {
  DataTempDir tmp("vision_folders");
  const std::string images = write_tiny_image_folder(tmp, 6);
  fs::create_directories(tmp.file("split"));
  fs::rename(images, tmp.file("split/train"));
  fs::copy(tmp.file("split/train"), tmp.file("split/test"), fs::copy_options::recursive);
  VisionTrainOptions o = tiny_options(tmp.file("split"), tmp.file("run"));
  o.epochs = 1;
  o.batch = 4;
  o.limit_train = 8;
  o.limit_test = 5;
  o.input_size = 12;
  o.augment = false;
  VisionTrainResult r = vision_train(o);
  CHECK(r.train_examples == 8);
  CHECK(r.test_examples == 5);
  CHECK(r.steps_done == 2);
  CHECK(r.config.input_size == 12);
  CHECK(r.images_per_s > 0);
  CHECK(r.peak_bytes > 0);
  CHECK(RunDir(r.run_dir).read_config().at("data").at("split") == "train/ and test/ folders");
  CHECK(vision_eval({.run = r.run_dir, .limit_test = 0}).examples == 12);
}

TEST_CASE("vision train and eval: bad flags and paths give one clear error", "[apps]") {
  DataTempDir tmp("vision_errors");
  const std::string images = write_tiny_image_folder(tmp, 6);
  VisionTrainOptions o = tiny_options(images, tmp.file("a"));
  o.config.reset();
  o.model = "mobilenetv3";
  CHECK_THROWS_WITH(vision_train(o), Catch::Contains("mobilenetv3") && Catch::Contains("mobilenetv2-32") &&
                                         Catch::Contains("mobilenetv2-224"));
  CHECK_FALSE(fs::exists(tmp.file("a")));

  o = tiny_options(tmp.file("no-images"), tmp.file("b"));
  CHECK_THROWS_WITH(vision_train(o), Catch::Contains("--data '" + tmp.file("no-images") + "' does not exist"));
  o = tiny_options(images + "/class0/0.png", tmp.file("b"));
  CHECK_THROWS_WITH(vision_train(o), Catch::Contains("is not a folder"));

  fs::create_directories(tmp.file("empty"));
  CHECK_THROWS_WITH(vision_train(resume_options(tmp.file("empty"))),
                    Catch::Contains("no config.json"));
  RunDir(tmp.file("empty")).write_config({{"command", "vision train"}});
  CHECK_THROWS_WITH(vision_train(resume_options(tmp.file("empty"))),
                    Catch::Contains("has no checkpoint"));
  CHECK_THROWS_WITH(vision_eval({.run = tmp.file("empty")}), Catch::Contains("has no checkpoint"));
  CHECK_THROWS_WITH(run_cli({"vision", "train", "--resume", tmp.file("empty"), "--batch", "3"}),
                    Catch::Contains("--batch cannot be given with --resume"));
}
