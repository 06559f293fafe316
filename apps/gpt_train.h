// GPT training and sampling as library calls (what `memgrad gpt train|sample` run, and what the
// tests call without the command line). Training reads random windows of a memory-mapped token
// file (the first 90% of it; the last 10% validates), steps AdamW with a cosine schedule and
// gradient clipping, logs metrics.csv and checkpoints into a run directory, and continues from
// a checkpoint so exactly that the resumed losses equal an uninterrupted run's, bit for bit.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "apps/progress.h"
#include "apps/train_common.h"
#include "models/gpt.h"

namespace mg {

// The default corpus: Debian's `fortunes` package (installed by scripts/setup).
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct GptTrainOptions {
  std::string config = "gpt-mini";  // a named GPTConfig (GPTConfig::names())
  std::optional<GPTConfig> model{}; // used instead of `config` when set (tiny test models)
  std::string data{};               // "" = fortunes; a text file, a folder of text, or a token file
  int64_t steps = 1000;
  int64_t batch = 8;
  double lr = 3e-4;                 // peak of the cosine schedule
  double weight_decay = 0.01;       // on parameters of rank >= 2 only
  double grad_clip = 1.0;           // global gradient norm
  int64_t warmup = -1;              // warmup steps; -1: 5% of steps
  double min_lr_ratio = 0.1;        // the schedule ends at lr * min_lr_ratio
  uint64_t seed = 1;                // weights, windows and dropout all derive from it
  std::string device = "cpu:0";
  std::string memory_limit{};       // device budget, e.g. "512MiB"
  std::string out{};                // run directory of a new run ("" = runs/<config>-<time>)
  std::string resume{};             // run directory to continue (its config.json decides the rest)
  int64_t resume_steps = 0;         // with resume: a new total step count (0: the run's own)
  int64_t eval_every = 100;         // validation loss every N steps (and at the end)
  int64_t eval_windows = 32;        // the fixed validation windows (consecutive, from the split)
  int64_t checkpoint_every = 100;   // a checkpoint every N steps (and at the end)
  TechniqueOptions techniques{};    // checkpointing, precision, accumulation, auto-fit, offload
  ProgressStyle progress = ProgressStyle::automatic;
  // Stop once this many steps are done, without the final checkpoint: an interruption (tests).
  int64_t stop_after = -1;
};

struct GptTrainResult {
  std::string run_dir{};
  int64_t first_step = 0;   // 0, or the checkpoint's step when resuming
  int64_t steps_done = 0;   // the step count when training stopped
  double last_loss = 0.0;
  double last_val_loss = 0.0;  // NaN when no validation ran
  double unigram_entropy = 0.0;  // of the validation split's tokens, nats (the context-free baseline)
  double ms_per_step = 0.0;    // median over this process's steps after the first
  double tokens_per_s = 0.0;   // batch * context / median step time
  int64_t peak_bytes = 0;      // the run's peak allocated bytes on the device
  int64_t num_parameters = 0;
  StepMemory memory{};        // steady-state peaks per category (steps after the first)
  int64_t micro_batch = 0;    // the micro-batch training ended with (0: whole batch)
  int64_t skipped_steps = 0;  // fp16 steps skipped for inf/NaN gradients
  bool interrupted = false;   // stopped by Ctrl-C (a checkpoint was written first)
  GPTConfig config;
};

GptTrainResult gpt_train(const GptTrainOptions& options);

struct GptSampleOptions {
  std::string run{};             // run directory with a checkpoint
  std::string prompt = "\n";     // the text to continue (a newline starts a fortune)
  int64_t tokens = 200;          // new tokens
  double temperature = 1.0;      // 0: greedy
  int64_t top_k = 0;             // 0: all tokens
  uint64_t seed = 0;
  std::string device = "cpu:0";
};

struct GptSampleResult {
  std::string text{};        // prompt + continuation
  std::string continuation{}; // the new tokens only
  double tokens_per_s = 0.0;
};

GptSampleResult gpt_sample(const GptSampleOptions& options);

}  // namespace mg
