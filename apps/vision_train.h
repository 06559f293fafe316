// MobileNetV2 training and evaluation as library calls (what `memgrad vision train|eval` run,
// and what the tests call). Data is Fashion-MNIST (gray 28x28 -> RGB, resized to the input
// size, normalized) or an image folder; training shuffles per epoch with a seeded order,
// optionally augments (random crop + flip keyed by (seed, epoch, index)), steps AdamW on a
// cosine schedule, reports test accuracy per epoch, and checkpoints so a resumed run's losses
// equal an uninterrupted run's exactly.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "apps/progress.h"
#include "apps/training_loop.h"
#include "data/dataset.h"
#include "models/mobilenet_v2.h"

namespace mg {

struct VisionTrainOptions : TrainOptions {
  VisionTrainOptions() {
    batch = 64;
    lr = 1e-3;  // not the workloads' 3e-4: a 30-step demo epoch learns visibly faster (loss 1.3 vs 1.9
                // after 2000 images)
  }
  std::string model = "mobilenetv2-32";    // a named MobileNetV2Config (MobileNetV2Config::names())
  std::optional<MobileNetV2Config> config{}; // used instead of `model` when set (tiny test models)
  std::string data = "fashion-mnist";       // or an image folder: root/<class>/<image>, or with
                                            // train/ and test/ (or val/) subfolders of that layout
  int64_t input_size = 0;                   // square input side; 0: the model's
  double width_mult = 0.0;                  // 0: the model's
  bool augment = false;                     // random crop (padding size/8) + horizontal flip
  int64_t epochs = 1;
  int64_t resume_epochs = 0;                // with resume: a new total epoch count (0: the run's)
  int64_t limit_train = 0;                  // use the first N training images (0: all)
  int64_t limit_test = 0;                   // use the first N test images (0: all)
};

struct VisionTrainResult : TrainResult {
  int64_t steps_per_epoch = 0;
  double test_accuracy = 0.0;  // after the last finished epoch; NaN when none finished here
  double images_per_s = 0.0;   // batch / median step time
  int64_t train_examples = 0, test_examples = 0;
  MobileNetV2Config config;
};

VisionTrainResult vision_train(const VisionTrainOptions& options);

struct VisionEvalOptions {
  std::string run{};
  std::string data{};       // "" = the run's
  int64_t limit_test = -1;  // -1 = the run's; 0 = all
  int64_t batch = 0;        // 0 = the run's
  std::string device = "cpu:0";
};

struct VisionEvalResult {
  double accuracy = 0.0;
  int64_t examples = 0;
  double images_per_s = 0.0;
  int64_t weight_bytes = 0;     // the model's parameters and buffers
  int64_t peak_bytes = 0;       // the device's peak allocated bytes during the test pass
  // A quantized run (memgrad quantize): its scheme ("int8_ptq", "int8_qat") and the fp32 figures
  // quantize recorded; "" and NaN for an fp32 run.
  std::string scheme{};
  double fp32_accuracy = std::nan("");
  int64_t fp32_weight_bytes = 0;
};

// A quantized run (config.json has a "quantized" section) runs its int8 model from the file.
VisionEvalResult vision_eval(const VisionEvalOptions& options);

// The train and test sets for `data` ("fashion-mnist" or an image folder) as (C, S, S) f32
// normalized inputs with () i64 labels; num_classes is set from the data.
struct VisionData {
  std::shared_ptr<const Dataset> train, test;
  int64_t num_classes = 0;
  std::string source{}; // "fashion-mnist" or the folder's absolute path
  std::string split{}; // how train and test were separated
};
VisionData load_vision_data(const std::string& data, int64_t input_size, bool augment, uint64_t seed,
                            int64_t limit_train, int64_t limit_test);

}  // namespace mg
