// `memgrad gpt train|eval|sample`: the command line over apps/gpt_train.h. train builds a named
// GPT configuration (or starts from a Hugging Face GPT-2 file), trains it on the fortunes corpus
// (or --data) into a run directory and prints loss, validation loss, throughput and memory;
// --resume continues a run from its last checkpoint. eval prints a run's validation loss and
// perplexity; sample continues a prompt with the run's latest weights.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "apps/run_setup.h"
#include "apps/train_flags.h"
#include "apps/gpt_train.h"
#include "core/allocator.h"
#include "core/error.h"

namespace mg {
namespace {

void print_train_result(const GptTrainResult& r) {
  if (r.steps_done == r.first_step) {
    std::printf("gpt train: %s is complete (step %lld); nothing to do (give --steps to train further)\n",
                r.run_dir.c_str(), (long long)r.steps_done);
    return;
  }
  std::printf("gpt train: steps %lld..%lld  loss %.4f", (long long)r.first_step, (long long)r.steps_done - 1,
              r.last_loss);
  if (!std::isnan(r.last_val_loss))
    std::printf("  val loss %.4f (unigram entropy %.4f)", r.last_val_loss, r.unigram_entropy);
  std::printf("  %.1f ms/step  %.0f tokens/s (median step)  peak %s\n", r.ms_per_step, r.tokens_per_s,
              format_bytes(r.peak_bytes).c_str());
  std::printf("run directory: %s (config.json, metrics.csv, checkpoint/)\n", r.run_dir.c_str());
  MG_CHECK(!r.interrupted, "gpt train: interrupted after step ", r.steps_done,
           "; the checkpoint is saved, continue with 'memgrad gpt train --resume ", r.run_dir, "'");
}

}  // namespace

void add_gpt_command(CLI::App& app) {
  CLI::App* gpt = app.add_subcommand("gpt", "Train a GPT on text and sample from it");
  gpt->require_subcommand(1);

  auto t = std::make_shared<GptTrainOptions>();
  CLI::App* train = gpt->add_subcommand("train", "Train a GPT into a run directory (or continue one)");
  // Flags that change the math of a run; with --resume the run's config.json fixes them.
  std::vector<CLI::Option*> fixed = add_train_flags(train, *t, "runs/<config>-<date>-<time>");
  for (CLI::Option* f : {
           train->add_option("--config", t->config, "model configuration: gpt-mini, gpt-small, gpt2-124m")
               ->capture_default_str(),
           train->add_option("--data", t->data,
                             "a text file, a folder of text or a token file (default: the fortunes corpus in " +
                                 std::string(kFortunesDir) + ")"),
           train->add_option("--init-from", t->init_from,
                             "start from a Hugging Face GPT-2 model.safetensors (its shapes must match --config)"),
           train->add_option("--eval-every", t->eval_every, "validation loss every N steps")->capture_default_str(),
       })
    fixed.push_back(f);
  CLI::Option* steps = train->add_option("--steps", t->steps, "training steps (with --resume: a new total)")
                           ->capture_default_str();
  train->callback([t, fixed, steps] {
    GptTrainOptions o = *t;
    if (!o.resume.empty()) {
      for (CLI::Option* f : fixed) reject_on_resume(f->count() > 0, f->get_name(), "gpt train");
      o.resume_steps = steps->count() > 0 ? t->steps : 0;
    }
    const GptTrainResult r = gpt_train(o);
    if (prints_results(o)) print_train_result(r);  // --ddp: rank 0 only
  });

  auto s = std::make_shared<GptSampleOptions>();
  CLI::App* sample = gpt->add_subcommand("sample", "Continue a prompt with a trained run's weights");
  sample->add_option("--run", s->run, "run directory (from gpt train)")->required();
  sample->add_option("--prompt", s->prompt, "text to continue (default: a newline)");
  sample->add_option("--tokens", s->tokens, "new tokens (bytes) to sample")->capture_default_str();
  sample->add_option("--temperature", s->temperature, "softmax temperature; 0 = greedy")->capture_default_str();
  sample->add_option("--top-k", s->top_k, "sample among the k most likely tokens; 0 = all")->capture_default_str();
  sample->add_option("--top-p", s->top_p, "sample among the most likely tokens whose probabilities sum to p; 1 = all")
      ->capture_default_str();
  sample->add_option("--seed", s->seed, "sampling seed")->capture_default_str();
  sample->add_option("--device", s->device, "device, e.g. cpu:0")->capture_default_str();
  sample->add_flag("--dense", s->dense, "a run pruned by magnitude: use the dense GEMM instead of the sparse kernel");
  sample->callback([s] {
    GptSampleResult r = gpt_sample(*s);
    std::printf("%s\n", r.text.c_str());
    std::fflush(stdout);  // the text first, then the figures on stderr (kept out of a redirected sample)
    std::fprintf(stderr, "gpt sample: %lld tokens at %.1f tokens/s\n", (long long)s->tokens, r.tokens_per_s);
  });

  auto e = std::make_shared<GptEvalOptions>();
  CLI::App* eval = gpt->add_subcommand("eval", "Print a trained run's validation loss and perplexity");
  eval->add_option("--run", e->run, "run directory (from gpt train)")->required();
  eval->add_option("--data", e->data, "a text or token file to evaluate on instead of the run's validation split");
  eval->add_option("--windows", e->windows, "windows of context tokens to evaluate (default: the run's)");
  eval->add_option("--batch", e->batch, "windows per batch (default: the run's)");
  eval->add_option("--device", e->device, "device, e.g. cpu:0")->capture_default_str();
  eval->add_flag("--dense", e->dense, "a run pruned by magnitude: use the dense GEMM instead of the sparse kernel");
  eval->callback([e] {
    GptEvalResult r = gpt_eval(*e);
    std::printf("gpt eval: %s  val loss %.4f  perplexity %.3f  (%lld windows, %lld tokens)  %.0f tokens/s  "
                "weights %.2f MiB  peak %.2f MiB%s\n",
                e->run.c_str(), r.loss, r.perplexity, (long long)r.windows, (long long)r.tokens, r.tokens_per_s,
                double(r.weight_bytes) / 1048576.0, double(r.peak_bytes) / 1048576.0,
                r.sparse_layers ? (", " + std::to_string(r.sparse_layers) + " sparse layers").c_str() : "");
    if (!r.scheme.empty()) {
      std::printf("  %-18s %10s %14s %12s %10s\n", "", "val loss", "weight bytes", "peak bytes", "tokens/s");
      std::printf("  %-18s %10.5f %14lld %12lld %10.0f\n", "fp32 (source run)", r.fp32_loss,
                  (long long)r.fp32_weight_bytes, (long long)r.fp32_peak_bytes, r.fp32_tokens_per_s);
      std::printf("  %-18s %10.5f %14lld %12lld %10.0f\n", r.scheme.c_str(), r.loss, (long long)r.weight_bytes,
                  (long long)r.peak_bytes, r.tokens_per_s);
      std::printf("  val loss %+.3f%%, weight bytes %.2fx smaller, tokens/s %.2fx\n",
                  100 * (r.loss - r.fp32_loss) / r.fp32_loss, double(r.fp32_weight_bytes) / double(r.weight_bytes),
                  r.fp32_tokens_per_s > 0 ? r.tokens_per_s / r.fp32_tokens_per_s : std::nan(""));
    }
  });
}

}  // namespace mg
