// GPT training, evaluation and sampling as library calls (what `memgrad gpt train|eval|sample`
// run, and what the tests call without the command line). Training reads random windows of a memory-mapped token
// file (the first 90% of it; the last 10% validates), steps AdamW with a cosine schedule and
// gradient clipping, logs metrics.csv and checkpoints into a run directory, and continues from
// a checkpoint so exactly that the resumed losses equal an uninterrupted run's, bit for bit.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "apps/progress.h"
#include "apps/training_loop.h"
#include "models/gpt.h"

namespace mg {

// The default corpus: Debian's `fortunes` package (installed by scripts/setup).
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct GptTrainOptions : TrainOptions {
  GptTrainOptions() {
    batch = 8;
    lr = 3e-4;
    grad_clip = 1.0;
    checkpoint_every = 100;
  }
  std::string config = "gpt-mini";  // a named GPTConfig (GPTConfig::names())
  std::optional<GPTConfig> model{}; // used instead of `config` when set (tiny test models)
  std::string data{};               // "" = fortunes; a text file, a folder of text, or a token file
  std::string init_from{};          // a Hugging Face GPT-2 model.safetensors to start from ("" = random)
  int64_t steps = 1000;
  int64_t resume_steps = 0;         // with resume: a new total step count (0: the run's own)
  int64_t eval_every = 100;         // validation loss every N steps (and at the end)
  int64_t eval_windows = 32;        // the fixed validation windows (consecutive, from the split)
};

struct GptTrainResult : TrainResult {
  double last_val_loss = 0.0;    // NaN when no validation ran
  double unigram_entropy = 0.0;  // of the validation split's tokens, nats (the context-free baseline)
  double tokens_per_s = 0.0;     // batch * context / median step time
  GPTConfig config;
};

GptTrainResult gpt_train(const GptTrainOptions& options);

struct GptSampleOptions {
  std::string run{};             // run directory with a checkpoint
  std::string prompt = "\n";     // the text to continue (a newline starts a fortune)
  int64_t tokens = 200;          // new tokens
  double temperature = 1.0;      // 0: greedy
  int64_t top_k = 0;             // 0: all tokens
  double top_p = 1.0;            // nucleus sampling; 1: all tokens
  uint64_t seed = 0;
  std::string device = "cpu:0";
  bool dense = false;            // a run pruned by magnitude: keep the dense GEMM (no SparseLinear)
};

struct GptSampleResult {
  std::string text{};        // prompt + continuation
  std::string continuation{}; // the new tokens only
  double tokens_per_s = 0.0;
};

GptSampleResult gpt_sample(const GptSampleOptions& options);

struct GptEvalOptions {
  std::string run{};             // run directory with a checkpoint
  std::string data{};            // "" = the run's validation split; else a text or token file (all of it)
  int64_t windows = 0;           // validation windows (0: the run's eval_windows)
  int64_t batch = 0;             // 0: the run's batch
  std::string device = "cpu:0";
  bool dense = false;            // a run pruned by magnitude: keep the dense GEMM (no SparseLinear)
};

struct GptEvalResult {
  double loss = 0.0;             // mean next-token cross-entropy, nats
  double perplexity = 0.0;       // exp(loss)
  int64_t windows = 0, tokens = 0;
  double tokens_per_s = 0.0;
  int64_t sparse_layers = 0;     // block Linears run by the sparse kernel (a run pruned by magnitude)
  int64_t weight_bytes = 0;      // the model's parameters and buffers as loaded for evaluation
  int64_t peak_bytes = 0;        // the device's peak allocated bytes during the evaluation
  // A quantized run (memgrad quantize): its scheme ("int8_weight_only", "int8_outlier") and, when
  // the fp32 run it came from still exists, that run evaluated the same way in the same process
  // (else the loss and weight bytes quantize recorded, tokens/s and peak 0). "" and NaN otherwise.
  std::string scheme{};
  double fp32_loss = std::nan("");
  int64_t fp32_weight_bytes = 0, fp32_peak_bytes = 0;
  double fp32_tokens_per_s = 0.0;
};

// The validation loss and perplexity of a run's latest weights, or of the int8 model of a
// quantized run (config.json has a "quantized" section), next to its fp32 source run.
GptEvalResult gpt_eval(const GptEvalOptions& options);

// A run pruned by magnitude (`memgrad prune --method unstructured`: its config records sparse
// weights) is computed for inference with the sparse kernel: every block Linear at or above
// kSparseKernelMinSparsity becomes a SparseLinear (models/compress/sparse_linear.h). Only on the
// host in f32 and unless `dense`; returns how many layers were converted (0 for any other run).
int64_t use_sparse_inference(const nlohmann::json& run_config, GPT& model, bool dense);

}  // namespace mg
