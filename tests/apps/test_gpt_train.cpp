// `gpt train` / `gpt sample` as library calls on a tiny GPT (vocab 256, context 16, 1 layer, 2
// heads, d 32, dropout on): an interrupted-and-resumed run logs exactly the losses of an
// uninterrupted one, the run directory holds what it promises, sampling reads it back, and bad
// flags and paths give clear errors (through the real command line too).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/gpt_train.h"
#include "apps/run_setup.h"
#include "apps/training_loop.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

GptTrainOptions tiny_options(const std::string& data, const std::string& out) {
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32, .dropout = 0.1};
  o.data = data;
  o.out = out;
  o.steps = 6;
  o.batch = 4;
  o.lr = 1e-2;
  o.warmup = 2;
  o.eval_every = 2;
  o.eval_windows = 8;
  o.checkpoint_every = 3;
  o.progress = ProgressStyle::none;
  return o;
}

}  // namespace

TEST_CASE("gpt train: an interrupted and resumed run equals the uninterrupted run exactly", "[apps]") {
  DataTempDir tmp("gpt_resume");
  const std::string data = write_tiny_token_file(tmp);

  GptTrainResult full = gpt_train(tiny_options(data, tmp.file("full")));
  CHECK(full.steps_done == 6);
  CHECK(std::isfinite(full.last_val_loss));
  CHECK(dropout_generator().offset() > 0);  // dropout drew masks, so its state matters below

  // Killed after 4 steps: the last checkpoint is at step 3, and metrics.csv already has step 3.
  GptTrainOptions first = tiny_options(data, tmp.file("split"));
  first.stop_after = 4;
  GptTrainResult part = gpt_train(first);
  CHECK(part.steps_done == 4);
  CHECK(metrics_column(tmp.file("split"), "step").size() == 4);
  manual_seed(999);  // whatever happened to the generators in between must not matter
  GptTrainOptions resume;
  resume.resume = tmp.file("split");
  resume.progress = ProgressStyle::none;
  GptTrainResult rest = gpt_train(resume);
  CHECK(rest.first_step == 3);
  CHECK(rest.steps_done == 6);

  const std::vector<std::string> losses = metrics_column(tmp.file("full"), "loss");
  REQUIRE(losses.size() == 6);
  CHECK(metrics_column(tmp.file("split"), "loss") == losses);  // as text: bit-identical doubles
  CHECK(metrics_column(tmp.file("split"), "val_loss") == metrics_column(tmp.file("full"), "val_loss"));
  CHECK(metrics_column(tmp.file("split"), "lr") == metrics_column(tmp.file("full"), "lr"));
  CHECK(losses.front() != losses.back());
  CHECK(full.last_loss == rest.last_loss);
}

TEST_CASE("gpt train: the run directory holds config, metrics and checkpoint", "[apps]") {
  DataTempDir tmp("gpt_run");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions o = tiny_options(data, tmp.file("run"));
  o.steps = 4;
  GptTrainResult r = gpt_train(o);
  CHECK(r.peak_bytes > 0);
  CHECK(r.tokens_per_s > 0);

  RunDir run(r.run_dir);
  nlohmann::json c = run.read_config();
  CHECK(GPTConfig::from_json(c.at("model")).d_model == 32);
  CHECK(c.at("optimizer").at("lr") == 1e-2);
  CHECK(c.at("optimizer").at("weight_decay") == 0.01);
  CHECK(c.at("schedule").at("warmup_steps") == 2);
  CHECK(c.at("data").at("token_file") == fs::absolute(data).lexically_normal().string());
  CHECK(c.at("batch") == 4);
  CHECK(c.at("steps") == 4);

  auto rows = read_metrics(run.metrics_path());
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].size() == 6);
  for (const char* col : {"step", "loss", "val_loss", "lr", "time_s", "peak_bytes"}) CHECK(rows[0].count(col));
  CHECK(rows[0].at("val_loss").empty());   // validation every 2 steps: after steps 1 and 3
  CHECK_FALSE(rows[1].at("val_loss").empty());
  CHECK(std::stod(rows[3].at("time_s")) >= std::stod(rows[0].at("time_s")));
  CHECK(std::stoll(rows[0].at("peak_bytes")) > 0);

  REQUIRE(run.has_checkpoint());
  nlohmann::json state = read_json_file(run.checkpoint_dir() + "/state.json");
  CHECK(state.at("step") == 4);
  CHECK(state.at("loader").at("batch").get<int64_t>() + state.at("loader").at("epoch").get<int64_t>() > 0);
  CHECK(state.at("generators").contains("dropout"));

  // Sampling reads the run back: the prompt, then exactly `tokens` more bytes; same seed, same text.
  GptSampleOptions s{.run = r.run_dir, .prompt = "the ", .tokens = 12, .temperature = 0.8, .top_k = 20, .seed = 4};
  GptSampleResult a = gpt_sample(s), b = gpt_sample(s);
  CHECK(a.text.substr(0, 4) == "the ");
  CHECK(a.continuation.size() == 12);
  CHECK(a.text == b.text);

  // A complete run resumed as is has nothing to do; with a larger total it trains further.
  GptTrainOptions again;
  again.resume = r.run_dir;
  again.progress = ProgressStyle::none;
  CHECK(gpt_train(again).steps_done == 4);
  again.resume_steps = 3;
  CHECK_THROWS_WITH(gpt_train(again), Catch::Contains("must be at least the 4 steps done"));
  CHECK(RunDir(r.run_dir).read_config().at("steps") == 4);  // unchanged by the refused resume
  again.resume_steps = 5;
  GptTrainResult more = gpt_train(again);
  CHECK(more.first_step == 4);
  CHECK(more.steps_done == 5);
  CHECK(metrics_column(r.run_dir, "step").size() == 5);
}

TEST_CASE("gpt train: a text file is tokenized into the run directory", "[apps]") {
  DataTempDir tmp("gpt_text");
  test::write_bytes(tmp.file("text.txt"), tiny_corpus(3000));
  GptTrainOptions o = tiny_options(tmp.file("text.txt"), tmp.file("run"));
  o.steps = 1;
  o.warmup = 0;
  gpt_train(o);
  CHECK(fs::exists(tmp.file("run/data.tokens")));
  CHECK(TokenFile(tmp.file("run/data.tokens")).size() == 3000);
  CHECK(RunDir(tmp.file("run")).read_config().at("data").at("token_file") == "data.tokens");
}

TEST_CASE("gpt train and sample: bad flags and paths give one clear error", "[apps]") {
  DataTempDir tmp("gpt_errors");
  const std::string data = write_tiny_token_file(tmp);

  GptTrainOptions o = tiny_options(data, tmp.file("a"));
  o.model.reset();
  o.config = "gpt-enormous";
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("unknown configuration 'gpt-enormous'") &&
                                      Catch::Contains("gpt-mini, gpt-small, gpt2-124m"));
  CHECK_FALSE(fs::exists(tmp.file("a")));  // a bad flag leaves no run directory behind

  o = tiny_options(tmp.file("missing.txt"), tmp.file("b"));
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("--data '" + tmp.file("missing.txt") + "' does not exist"));

  fs::create_directories(tmp.file("empty"));
  GptTrainOptions r;
  r.resume = tmp.file("empty");
  r.progress = ProgressStyle::none;
  CHECK_THROWS_WITH(gpt_train(r), Catch::Contains("is not a run directory (it has no config.json)"));
  RunDir(tmp.file("empty")).write_config({{"command", "gpt train"}});
  CHECK_THROWS_WITH(gpt_train(r), Catch::Contains("run directory '" + tmp.file("empty") + "' has no checkpoint"));
  r.resume = tmp.file("nowhere");
  CHECK_THROWS_WITH(gpt_train(r), Catch::Contains("'" + tmp.file("nowhere") + "' does not exist"));

  o = tiny_options(data, tmp.file("done"));
  o.steps = 2;
  o.warmup = 3;
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("--warmup (3) must be smaller than --steps (2)"));
  o.warmup = 0;
  gpt_train(o);
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("already holds a checkpoint") && Catch::Contains("--resume"));
  CHECK_THROWS_WITH(gpt_sample({.run = tmp.file("done"), .prompt = ""}), Catch::Contains("--prompt is empty"));
  CHECK_THROWS_WITH(gpt_sample({.run = tmp.file("empty")}), Catch::Contains("has no checkpoint"));

  // Through the command line: a math flag with --resume, an unknown config, a bad limit.
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--resume", tmp.file("done"), "--lr", "1"}),
                    Catch::Contains("--lr cannot be given with --resume"));
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--config", "nope", "--out", tmp.file("c")}),
                    Catch::Contains("known: gpt-mini"));
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--data", data, "--out", tmp.file("d"), "--memory-limit", "lots"}),
                    Catch::Contains("lots"));
  CHECK_THROWS_WITH(run_cli({"data", "tokenize", tmp.file("no-such-dir"), "--out", tmp.file("x.tokens")}),
                    Catch::Contains("'" + tmp.file("no-such-dir") + "' does not exist"));
}

TEST_CASE("data tokenize writes a token file through the command line", "[apps]") {
  DataTempDir tmp("data_cmd");
  test::write_bytes(tmp.file("in/a.txt"), "hello ");
  test::write_bytes(tmp.file("in/b.txt"), "world");
  run_cli({"data", "tokenize", tmp.file("in"), "--out", tmp.file("out/corpus.tokens")});
  TokenFile f(tmp.file("out/corpus.tokens"));
  CHECK(f.size() == 11);
  CHECK(f[6] == uint32_t('w'));
}

TEST_CASE("gpt train with techniques: recorded in config.json, resumed exactly, profiled on request", "[apps]") {
  DataTempDir tmp("gpt_techniques");
  const std::string data = write_tiny_token_file(tmp);
  auto with_techniques = [&](const std::string& out) {
    GptTrainOptions o = tiny_options(data, out);
    o.model->n_layer = 2;
    o.model->dropout = 0.0;  // micro-batches draw their masks in another order than the whole batch
    o.techniques.checkpoint = CheckpointPolicy::parse("blocks");
    o.techniques.micro_batch = 2;
    o.techniques.offload_activations = Device("cpu:1");
    return o;
  };
  GptTrainOptions plain_opts = tiny_options(data, tmp.file("plain"));
  plain_opts.model->n_layer = 2;
  plain_opts.model->dropout = 0.0;
  GptTrainResult plain = gpt_train(plain_opts);
  GptTrainResult full = gpt_train(with_techniques(tmp.file("full")));
  CHECK(full.micro_batch == 2);
  CHECK(std::isfinite(full.last_loss));
  // Checkpointing and offload change nothing of the math; accumulation only rounding.
  CHECK(full.last_loss == Approx(plain.last_loss).epsilon(1e-4));
  CHECK(full.memory.category[size_t(MemoryCategory::activation)] <
        plain.memory.category[size_t(MemoryCategory::activation)]);

  GptTrainOptions first = with_techniques(tmp.file("split"));
  first.stop_after = 4;
  gpt_train(first);
  GptTrainOptions resume;
  resume.resume = tmp.file("split");
  resume.progress = ProgressStyle::none;
  resume.techniques.profile = true;
  GptTrainResult rest = gpt_train(resume);  // the run's own techniques come from its config.json
  CHECK(rest.micro_batch == 2);
  CHECK(metrics_column(tmp.file("split"), "loss") == metrics_column(tmp.file("full"), "loss"));
  CHECK(fs::exists(tmp.file("split") + "/memory.json"));
  CHECK(fs::exists(tmp.file("split") + "/memory.html"));
  // Parameters and optimizer state are named by their paths, with the tensor's own size.
  const std::string profile = test::read_bytes(tmp.file("split") + "/memory.json");
  CHECK(profile.find("wte.weight\"") != std::string::npos);
  CHECK(profile.find("wte.weight.exp_avg\"") != std::string::npos);
  CHECK(profile.find("\"requested\"") != std::string::npos);

  GptTrainOptions bad = tiny_options(data, tmp.file("bad"));
  bad.techniques.micro_batch = 5;
  CHECK_THROWS_WITH(gpt_train(bad), Catch::Contains("--micro-batch (5) cannot exceed --batch (4)"));
  bad.techniques.micro_batch = 0;
  bad.techniques.offload_activations = Device("cpu:0");
  CHECK_THROWS_WITH(gpt_train(bad), Catch::Contains("needs another device"));
  // Values are typed at the command line: a bad one is an error naming its flag and the subcommand.
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--data", data, "--out", tmp.file("bad"), "--checkpoint", "layers"}),
                    Catch::Contains("--checkpoint") && Catch::Contains("checkpoint policy 'layers' is unknown"));
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--data", data, "--out", tmp.file("bad"), "--precision", "int4"}),
                    Catch::Contains("--precision") && Catch::Contains("unknown precision 'int4'"));
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--data", data, "--out", tmp.file("bad"), "--optimizer", "lion"}),
                    Catch::Contains("--optimizer") && Catch::Contains("unknown optimizer 'lion'"));
  // --optimizer adamw8bit keeps both moments in 8 bits: the run's optimizer state is far smaller.
  GptTrainOptions small = tiny_options(data, tmp.file("adamw8bit"));
  small.model->d_model = 128;  // tensors of >= 4096 elements, which AdamW8bit quantizes
  small.steps = 2;
  small.warmup = 0;
  GptTrainOptions full32 = small;
  full32.out = tmp.file("adamw32");
  small.optimizer = OptimizerKind::adamw8bit;
  const GptTrainResult r8 = gpt_train(small), r32 = gpt_train(full32);
  const auto state = [](const GptTrainResult& r) { return r.memory.category[size_t(MemoryCategory::optimizer_state)]; };
  CHECK(std::isfinite(r8.last_loss));
  CHECK(double(state(r8)) < 0.5 * double(state(r32)));
  CHECK(RunDir(r8.run_dir).read_config().at("optimizer").at("type") == "adamw8bit");
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--data", data, "--out", tmp.file("bad"), "--offload-activations", "tpu:0"}),
                    Catch::Contains("--offload-activations"));
  CHECK_FALSE(fs::exists(tmp.file("bad")));  // a bad flag leaves nothing behind
}

TEST_CASE("gpt train --init-from a Hugging Face GPT-2 file, gpt eval and top-p sampling", "[apps]") {
  DataTempDir tmp("gpt_init_from");
  // The fixture's vocabulary has 100 tokens: a corpus of tokens below 64.
  std::string text = tiny_corpus(4000);
  std::vector<uint32_t> tokens(text.begin(), text.end());
  for (auto& t : tokens) t %= 64;
  write_token_file(tmp.file("small.tokens"), tokens, 1);
  const std::string hf = std::string(MG_FIXTURE_DIR) + "/gpt2_hf_tiny.safetensors";
  GptTrainOptions o = tiny_options(tmp.file("small.tokens"), tmp.file("run"));
  o.model = GPTConfig{.vocab_size = 100, .context = 32, .n_layer = 2, .n_head = 2, .d_model = 32};
  o.init_from = hf;
  o.steps = 1;
  o.warmup = 0;
  o.lr = 1e-12;  // a step that leaves the weights (almost) as loaded
  GptTrainResult r = gpt_train(o);
  GPT direct(*o.model, {});
  direct.load_hf_gpt2(hf);
  GPT trained(*o.model, {});
  RunDir(r.run_dir).load_weights(trained);
  CHECK(test::all_close(trained.wte->weight.to_double_vector(), direct.wte->weight.to_double_vector(), 0, 1e-9));
  CHECK(RunDir(r.run_dir).read_config().at("init_from") == fs::absolute(hf).lexically_normal().string());

  // gpt eval reads the run back: the same windows and batch give the loss training printed last.
  GptEvalResult e = gpt_eval({.run = r.run_dir});
  CHECK(e.loss == Approx(r.last_val_loss).epsilon(1e-12));
  CHECK(e.perplexity == Approx(std::exp(e.loss)));
  CHECK(e.windows == std::min<int64_t>(8, (400 - 1) / 32));
  CHECK_THROWS_WITH(gpt_eval({.run = tmp.file("nowhere")}), Catch::Contains("does not exist"));

  o.init_from = tmp.file("missing.safetensors");
  o.out = tmp.file("run2");
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("--init-from") && Catch::Contains("is not a file"));
}

TEST_CASE("gpt sample: top-p keeps the nucleus, a tiny p is greedy", "[apps]") {
  DataTempDir tmp("gpt_top_p");
  GptTrainOptions o = tiny_options(write_tiny_token_file(tmp), tmp.file("run"));
  o.steps = 2;
  o.warmup = 0;
  GptTrainResult r = gpt_train(o);
  GptSampleOptions greedy{.run = r.run_dir, .prompt = "the ", .tokens = 10, .temperature = 0.0};
  GptSampleOptions nucleus{.run = r.run_dir, .prompt = "the ", .tokens = 10, .temperature = 1.0, .top_p = 1e-9};
  CHECK(gpt_sample(nucleus).text == gpt_sample(greedy).text);
  nucleus.top_p = 1.5;
  CHECK_THROWS_WITH(gpt_sample(nucleus), Catch::Contains("--top-p must be in (0, 1]"));
}
