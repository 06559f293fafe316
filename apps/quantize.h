// `memgrad quantize` as a library call: int8 quantization of a trained run, post-training (ptq)
// or after quantization-aware fine-tuning (qat, vision runs: models/compress/qat.h).
// A vision run (MobileNetV2): BatchNorm folded, activation ranges calibrated over N training
// batches with the chosen observer, 1x1 convs and the classifier on the int8 GEMM, other convs
// int8 weight-only. A gpt run: every block Linear int8 weight-only (no calibration needed).
// The fp32 and int8 models are evaluated in one process (test accuracy or validation loss,
// weight bytes, images or tokens per second) and the int8 model is written to a new run folder
// (config.json with a "quantized" section + model.int8.safetensors, quant_format.h).
// qat: BatchNorm folded, fake-quant layers inserted, --qat-steps AdamW steps on the run's training
// data (cosine from --qat-lr, the Trainer with --precision / --micro-batch / --checkpoint), then
// converted to the same int8 layers PTQ makes, with the ranges the observers tracked;
// --qat-scales learned trains the weight and input scales too (LSQ) and converts with those.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "apps/technique_options.h"
#include "apps/training_loop.h"
#include "models/nn/module.h"
#include "optim/optimizer.h"

namespace mg {

struct QuantizeOptions {
  std::string run{};               // a `vision train` or `gpt train` run directory
  std::string out{};               // the new run directory (must not exist)
  std::string mode = "ptq";        // ptq | qat (vision runs)
  int64_t calibrate = 32;          // ptq: calibration batches (vision), >= 1
  std::string observer{};          // minmax | ema | percentile | mse; "": minmax (ptq), ema (qat)
  int64_t qat_steps = 0;           // qat: fine-tuning steps, >= 1
  double qat_lr = 1e-4;            // qat: peak of the cosine schedule (AdamW, weight decay 0.01)
  std::string qat_scales{};        // qat: observed | learned (models/compress/qat.h); "": observed
  std::optional<double> qat_scale_lr{};  // qat learned: the scales' lr as a factor of --qat-lr (weight decay 0); unset: 1
  TechniqueOptions techniques{};   // qat: checkpointing, precision, micro-batch of the fine-tuning
  std::string gpt_mode = "weight-only";  // gpt: weight-only | int8-outlier (int8_outlier_linear.h)
  double outlier_threshold = 6.0;  // gpt int8-outlier: |x| above this keeps a column in f32
  int64_t batch = 0;               // 0: the run's
  int64_t limit_test = -1;         // vision: -1 = the run's, 0 = all test images
  int64_t eval_windows = 32;       // gpt: validation windows
  std::string device = "cpu:0";
};

struct QuantizeResult {
  std::string model;               // "mobilenetv2" or "gpt"
  std::string metric;              // "test accuracy" or "val loss"
  double fp32_metric = 0, int8_metric = 0;
  int64_t fp32_weight_bytes = 0, int8_weight_bytes = 0;
  double fp32_per_s = 0, int8_per_s = 0;  // images or tokens per second (evaluation forwards)
  int64_t examples = 0;            // test images or validation windows
  std::string file;                // the quantized model file
  double qat_first_loss = 0, qat_last_loss = 0;  // qat: training loss of the first and last step
  std::string observer;            // the observer used
  double outlier_column_share = 0; // gpt int8-outlier: input columns kept in f32 (last batch, all layers)
};

QuantizeResult quantize_run(const QuantizeOptions& options);

// QAT's AdamW over a prepared model (models/compress/qat.h). Learned scales get a group of their
// own, "qat_scales": lr scale_lr x t.lr (its lr_scale, so a schedule's set_lr keeps the ratio) and
// no weight decay (a decayed scale shrinks toward 0 and clips every value); the other parameters
// are grouped as in training (weight decay on rank >= 2). scale_lr 1 steps every parameter as
// one AdamW over weight_decay_groups would (the scales are rank 1, undecayed there too).
std::unique_ptr<Optimizer> qat_optimizer(const TrainOptions& t, Module& model, double scale_lr);

// The config.json key that marks a quantized run, and the file it names.
inline constexpr const char* kQuantizedConfigKey = "quantized";
inline constexpr const char* kQuantizedModelFile = "model.int8.safetensors";

}  // namespace mg
