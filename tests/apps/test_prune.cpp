// `memgrad prune` as a library call and through its command line, on tiny trained runs: a
// structured prune writes a run every command loads (gpt sample, vision eval, train --resume)
// with fewer parameter bytes; fine-tuning continues the run; unstructured pruning stores the
// weights >= 3x smaller and its masks hold through fine-tuning; a sweep writes the curve (CSV,
// self-contained HTML) with bytes falling as the amount grows; bad input gives clear errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/apps_test_util.h"
#include "apps/gpt_train.h"
#include "apps/prune_run.h"
#include "apps/prune_sweep.h"
#include "apps/vision_train.h"
#include "core/safetensors.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

std::string tiny_gpt_run(const DataTempDir& tmp, const std::string& name) {
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32};
  o.data = write_tiny_token_file(tmp);
  o.out = tmp.file(name);
  o.steps = 4;
  o.batch = 4;
  o.lr = 1e-2;
  o.warmup = 1;
  o.eval_every = 2;
  o.eval_windows = 4;
  o.checkpoint_every = 4;
  o.progress = ProgressStyle::none;
  gpt_train(o);
  return o.out;
}

std::string tiny_vision_run(const DataTempDir& tmp, const std::string& name) {
  VisionTrainOptions o;
  o.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8};
  o.data = write_tiny_image_folder(tmp, 20);
  o.out = tmp.file(name);
  o.epochs = 1;
  o.batch = 12;
  o.lr = 1e-2;
  o.progress = ProgressStyle::none;
  vision_train(o);
  return o.out;
}

void run_prune_cli(const std::vector<std::string>& args) {
  CLI::App app{"memgrad"};
  app.require_subcommand(1);
  add_prune_command(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
}

}  // namespace

TEST_CASE("prune command: gpt structured run directory samples, resumes and is smaller", "[prune][apps]") {
  DataTempDir tmp("prune_gpt");
  const std::string run = tiny_gpt_run(tmp, "run");
  const std::string criterion = GENERATE("l1", "taylor");
  const std::string out = tmp.file("pruned-" + criterion);
  PruneResult r = prune_run({.run = run, .out = out, .amount = 0.5, .criterion = criterion, .target = "mlp+heads",
                             .finetune_steps = 2, .progress = ProgressStyle::none});
  CHECK(r.kind == "gpt");
  CHECK(r.parameters_after < r.parameters_before);
  CHECK(r.parameter_bytes_after < r.parameter_bytes_before);
  CHECK(r.finetune_steps == 2);
  CHECK(std::isfinite(r.quality_finetuned));
  const nlohmann::json cfg = RunDir(out).read_config();
  CHECK(cfg.at("model").at("mlp_hidden") == nlohmann::json({64, 64}));
  CHECK(cfg.at("model").at("layer_heads") == nlohmann::json({1, 1}));
  CHECK(cfg.at("pruning").at("criterion") == criterion);
  CHECK(RunDir(out).read_checkpoint_state().step == 6);
  CHECK(metrics_column(out, "step").size() == 6);  // the source's 4 rows, then 2 fine-tune rows
  CHECK(gpt_sample({.run = out, .prompt = "the ", .tokens = 8}).continuation.size() == 8);
  CHECK(prune_report(r).find("parameter bytes") != std::string::npos);
}

TEST_CASE("prune command: --finetune-lr gives the fine-tune its own cosine", "[prune][apps]") {
  DataTempDir tmp("prune_gpt_ftlr");
  const std::string run = tiny_gpt_run(tmp, "run");
  const std::string out = tmp.file("ftlr");
  run_prune_cli({"prune", "--run", run, "--out", out, "--amount", "0.5", "--finetune-steps", "3", "--finetune-lr", "0.005"});
  std::vector<double> lr;
  for (const std::string& v : metrics_column(out, "lr")) lr.push_back(std::stod(v));
  REQUIRE(lr.size() == 7);  // the source's 4 steps, then 3 fine-tune steps
  CHECK(lr[4] == Approx(0.005));             // the peak at the pruned step
  CHECK(lr[5] < lr[4]);                      // then the cosine falls
  CHECK(lr[6] > 0.005 * 0.1);                // towards the run's min/peak ratio (0.1)
  const nlohmann::json s = RunDir(out).read_config().at("schedule");
  CHECK(s.at("warmup_steps") == 4);
  CHECK(s.at("total_steps") == 7);
  CHECK_THROWS_WITH(prune_run({.run = run, .out = tmp.file("bad"), .finetune_lr = -1.0}),
                    Catch::Contains("--finetune-lr must be >= 0"));
}

TEST_CASE("prune command: gpt unstructured stores the weights sparse and keeps them at zero through fine-tuning", "[prune][apps]") {
  DataTempDir tmp("prune_gpt_sparse");
  const std::string run = tiny_gpt_run(tmp, "run");
  const std::string out = tmp.file("sparse");
  run_prune_cli({"prune", "--run", run, "--out", out, "--method", "unstructured", "--amount", "0.8", "--scope",
                 "global", "--finetune-steps", "2"});
  const nlohmann::json cfg = RunDir(out).read_config();
  CHECK(cfg.at("pruning").at("sparsity").get<double>() == Approx(0.8).margin(1e-3));
  // After fine-tuning the masked weights are still 80% zeros, and the sparse file holds them.
  int64_t zeros = 0, total = 0;
  for (auto& [name, t] : load_safetensors(RunDir(out).checkpoint_dir() + "/model.safetensors"))
    if (t.dim() == 2 && name.find(".c_") != std::string::npos)
      for (double v : t.to_double_vector()) zeros += v == 0.0, ++total;
  CHECK(total > 0);
  CHECK(zeros >= int64_t(0.8 * double(total)));
  CHECK(fs::exists(RunDir(out).file("model.sparse.safetensors")));

  PruneResult r = prune_run({.run = run, .out = tmp.file("sparse2"), .method = "unstructured", .amount = 0.8,
                             .progress = ProgressStyle::none});
  CHECK(r.sparse_weight_bytes * 3 <= r.dense_weight_bytes);
  CHECK(r.parameter_bytes_after == r.parameter_bytes_before);  // dense in memory

  // Loaded for inference, its block Linears run sparse: the same loss, fewer weight bytes.
  const GptEvalResult sparse = gpt_eval({.run = r.out_dir});
  const GptEvalResult dense = gpt_eval({.run = r.out_dir, .dense = true});
  CHECK(sparse.sparse_layers == 8);  // 2 blocks x (c_attn, attn c_proj, c_fc, mlp c_proj)
  CHECK(dense.sparse_layers == 0);
  CHECK(sparse.loss == Approx(dense.loss).epsilon(1e-5));
  CHECK(sparse.weight_bytes < dense.weight_bytes);
  CHECK(gpt_eval({.run = run}).sparse_layers == 0);  // an unpruned run stays dense
  CHECK(gpt_sample({.run = r.out_dir, .prompt = "the ", .tokens = 4, .temperature = 0}).continuation ==
        gpt_sample({.run = r.out_dir, .prompt = "the ", .tokens = 4, .temperature = 0, .dense = true}).continuation);
}

TEST_CASE("prune command: 2:4 stores the 2:4 layout, keeps the pattern through fine-tuning, runs sparse", "[prune][apps][sparse24]") {
  DataTempDir tmp("prune_gpt_24");
  const std::string run = tiny_gpt_run(tmp, "run");
  const std::string out = tmp.file("p24");
  run_prune_cli({"prune", "--run", run, "--out", out, "--method", "2:4", "--finetune-steps", "2"});
  const nlohmann::json cfg = RunDir(out).read_config();
  CHECK(cfg.at("pruning").at("pattern") == "2:4");
  CHECK(cfg.at("pruning").at("sparsity").get<double>() == 0.5);
  int64_t checked = 0;
  for (auto& [name, t] : load_safetensors(RunDir(out).checkpoint_dir() + "/model.safetensors"))
    if (t.dim() == 2 && name.find(".c_") != std::string::npos) {
      CHECK(is_24_sparse(t));
      ++checked;
    }
  CHECK(checked == 8);
  int64_t entries24 = 0;
  for (auto& [name, t] : load_safetensors(RunDir(out).file("model.sparse.safetensors")))
    entries24 += name.find(".__24values") != std::string::npos;
  CHECK(entries24 == 8);

  PruneResult r = prune_run({.run = run, .out = tmp.file("p24b"), .method = "2:4", .progress = ProgressStyle::none});
  CHECK(r.sparsity == 0.5);
  CHECK(r.sparse_weight_bytes * 16 == r.dense_weight_bytes * 17 / 2);  // 2 + 1/8 bytes for 4
  CHECK(prune_report(r).find("2:4 values+indices") != std::string::npos);
  const GptEvalResult sparse = gpt_eval({.run = r.out_dir});
  const GptEvalResult dense = gpt_eval({.run = r.out_dir, .dense = true});
  CHECK(sparse.sparse_layers == 8);
  CHECK(sparse.loss == Approx(dense.loss).epsilon(1e-5));
  CHECK(sparse.weight_bytes < dense.weight_bytes);
  CHECK(gpt_sample({.run = r.out_dir, .prompt = "the ", .tokens = 4, .temperature = 0}).continuation ==
        gpt_sample({.run = r.out_dir, .prompt = "the ", .tokens = 4, .temperature = 0, .dense = true}).continuation);
  CHECK_THROWS_WITH(prune_run({.run = run, .out = tmp.file("bad"), .method = "2:4", .amount = 0.3}),
                    Catch::Contains("leave --amount at 0.5"));
  CHECK_THROWS_WITH(prune_sweep({.run = run, .out = tmp.file("bad"), .method = "2:4"}, {0.0, 0.5}),
                    Catch::Contains("--method 2:4 has a single one"));
}

TEST_CASE("prune command: gradual schedule raises the sparsity while fine-tuning and reaches the final one", "[prune][apps]") {
  DataTempDir tmp("prune_gpt_gradual");
  const std::string run = tiny_gpt_run(tmp, "run");
  const std::string out = tmp.file("gradual");
  run_prune_cli({"prune", "--run", run, "--out", out, "--method", "unstructured", "--amount", "0.8", "--schedule",
                 "gradual", "--finetune-steps", "8"});
  const nlohmann::json cfg = RunDir(out).read_config();
  const GradualSchedule sched = GradualSchedule::from_json(cfg.at("pruning").at("schedule"));
  CHECK(sched.begin == 4);
  CHECK(sched.end == 4 + 6);
  CHECK(sched.final == 0.8);
  CHECK(cfg.at("pruning").at("sparsity").get<double>() == Approx(0.8).margin(1e-3));  // refreshed after fine-tuning
  int64_t zeros = 0, total = 0;
  for (auto& [name, t] : load_safetensors(RunDir(out).checkpoint_dir() + "/model.safetensors"))
    if (t.dim() == 2 && name.find(".c_") != std::string::npos)
      for (double v : t.to_double_vector()) zeros += v == 0.0, ++total;
  CHECK(zeros == Approx(0.8 * double(total)).margin(8));
  // The sparse file holds the fine-tuned weights (not those at the start, which were dense).
  int64_t stored = 0;
  NamedTensors sparse = load_sparse_safetensors(RunDir(out).file("model.sparse.safetensors"), &stored);
  CHECK(stored == cfg.at("pruning").at("sparse_bytes").get<int64_t>());
  for (auto& [name, t] : load_safetensors(RunDir(out).checkpoint_dir() + "/model.safetensors"))
    for (auto& [sname, s] : sparse)
      if (sname == name) CHECK(s.to_double_vector() == t.to_double_vector());

  CHECK_THROWS_WITH(prune_run({.run = run, .out = tmp.file("g1"), .method = "unstructured", .finetune_steps = 1,
                               .schedule = "gradual"}),
                    Catch::Contains("--finetune-steps >= 2"));
  CHECK_THROWS_WITH(prune_run({.run = run, .out = tmp.file("g2"), .finetune_steps = 4, .schedule = "gradual"}),
                    Catch::Contains("use it with --method unstructured"));
  CHECK_THROWS_WITH(prune_run({.run = run, .out = tmp.file("g3"), .schedule = "cubic"}),
                    Catch::Contains("--schedule must be oneshot or gradual"));
}

TEST_CASE("prune command: vision structured run evaluates and fine-tunes", "[prune][apps][slow]") {
  DataTempDir tmp("prune_vision");
  const std::string run = tiny_vision_run(tmp, "run");
  const std::string criterion = GENERATE("bn", "taylor");
  const std::string out = tmp.file("pruned-" + criterion);
  PruneResult r = prune_run({.run = run, .out = out, .amount = 0.5, .criterion = criterion, .finetune_steps = 2,
                             .progress = ProgressStyle::none});
  CHECK(r.kind == "vision");
  CHECK(r.parameter_bytes_after < r.parameter_bytes_before);
  CHECK(std::isfinite(r.quality_before));
  CHECK(std::isfinite(r.quality_pruned));
  CHECK(std::isfinite(r.quality_finetuned));
  CHECK(r.finetune_steps == 2);
  const nlohmann::json cfg = RunDir(out).read_config();
  CHECK(cfg.at("model").at("block_hidden").size() == 17);
  CHECK(cfg.at("checkpoint_every") == RunDir(run).read_config().at("checkpoint_every"));
  CHECK(RunDir(out).read_checkpoint_state().step == 3 + 2);
  CHECK(std::isfinite(vision_eval({.run = out}).accuracy));
}

TEST_CASE("prune command: --distill fine-tunes a vision run from its unpruned source", "[prune][apps][slow]") {
  DataTempDir tmp("prune_distill");
  const std::string run = tiny_vision_run(tmp, "run");
  auto prune = [&](const std::string& name, double distill) {
    return prune_run({.run = run, .out = tmp.file(name), .amount = 0.5, .finetune_steps = 2, .distill = distill,
                      .distill_temperature = 3.0, .progress = ProgressStyle::none});
  };
  const PruneResult plain = prune("plain", 0.0), distilled = prune("distilled", 0.7);
  CHECK(distilled.finetune_steps == 2);
  CHECK(std::isfinite(distilled.quality_finetuned));
  // The same pruned start, a different loss: the fine-tuned weights differ.
  CHECK(distilled.quality_pruned == plain.quality_pruned);
  const auto w_plain = load_safetensors(RunDir(tmp.file("plain")).checkpoint_dir() + "/model.safetensors");
  const auto w_distilled = load_safetensors(RunDir(tmp.file("distilled")).checkpoint_dir() + "/model.safetensors");
  int64_t differ = 0;
  REQUIRE(w_plain.size() == w_distilled.size());
  for (size_t i = 0; i < w_plain.size(); ++i)
    differ += w_plain[i].second.to_vector<double>() != w_distilled[i].second.to_vector<double>();
  CHECK(differ > 0);
  // config.json names the teacher (absolute), so resuming the run keeps distilling.
  const nlohmann::json cfg = RunDir(tmp.file("distilled")).read_config();
  CHECK(cfg.at("distill").at("weight") == 0.7);
  CHECK(cfg.at("distill").at("temperature") == 3.0);
  CHECK(fs::path(cfg.at("distill").at("teacher").get<std::string>()) == fs::absolute(run).lexically_normal());
  CHECK_FALSE(RunDir(tmp.file("plain")).read_config().contains("distill"));
  // Without its teacher the run says so instead of silently training on the labels only.
  fs::rename(run, tmp.file("moved"));
  VisionTrainOptions resume;
  resume.resume = tmp.file("distilled");
  resume.resume_epochs = 2;
  resume.progress = ProgressStyle::none;
  CHECK_THROWS_WITH(vision_train(resume), Catch::Contains("distillation teacher"));
}

TEST_CASE("prune command: bad input is a clear error", "[prune][apps]") {
  DataTempDir tmp("prune_errors");
  const std::string run = tiny_gpt_run(tmp, "run");
  auto fails = [&](PruneOptions o, const std::string& msg) {
    if (o.run.empty()) o.run = run;
    if (o.out.empty()) o.out = tmp.file("out");
    o.progress = ProgressStyle::none;
    CHECK_THROWS_WITH(prune_run(o), Catch::Contains(msg));
  };
  fails({.amount = 1.0}, "--amount must be in [0, 1)");
  fails({.amount = -0.5}, "--amount must be in [0, 1)");
  fails({.run = tmp.dir.string()}, "is not a run directory");
  fails({.run = tmp.file("nothing")}, "does not exist");
  fails({.out = run}, "--out must differ from --run");
  fails({.criterion = "bn"}, "has no BatchNorm");
  fails({.criterion = "l3"}, "unknown criterion 'l3'");
  fails({.method = "unstructured", .criterion = "taylor"}, "applies to --method structured");
  fails({.method = "lottery"}, "--method must be structured, unstructured or 2:4");
  fails({.target = "layers"}, "--target must be mlp, heads or mlp+heads");
  fails({.target = "expansion"}, "--target must be mlp, heads or mlp+heads");
  fails({.scope = "model"}, "unknown scope 'model'");
  fails({.finetune_steps = 2, .distill = 1.5}, "distillation weight must be in [0, 1]");
  fails({.finetune_steps = 2, .distill = 0.5, .distill_temperature = 0.0}, "temperature must be > 0");
  fails({.distill = 0.5}, "--distill shapes the fine-tune");
  fails({.finetune_steps = 2, .distill = 0.5}, "--distill fine-tunes vision runs");
  // taylor without data: the run's token file is gone.
  fs::remove(RunDir(run).read_config().at("data").at("token_file").get<std::string>());
  fails({.criterion = "taylor"}, "needs the run's training data");
  CHECK_FALSE(fs::exists(tmp.file("out") + "/checkpoint"));  // nothing half-written
  CHECK_THROWS_WITH(run_prune_cli({"prune", "--run", run}), Catch::Contains("--out is required"));
}

TEST_CASE("prune command: --sweep writes the curve as CSV and self-contained HTML", "[prune][apps]") {
  DataTempDir tmp("prune_sweep");
  const std::string run = tiny_gpt_run(tmp, "run");
  const std::string out = tmp.file("sweep");
  SweepResult r = prune_sweep({.run = run, .out = out, .target = "mlp", .finetune_steps = 1, .bench_steps = 2,
                               .progress = ProgressStyle::none},
                              parse_sweep("0,0.5,0.75"));
  REQUIRE(r.points.size() == 3);
  for (size_t i = 1; i < r.points.size(); ++i) {  // every byte count falls with the amount
    CHECK(r.points[i].parameter_bytes < r.points[i - 1].parameter_bytes);
    CHECK(r.points[i].train_peak < r.points[i - 1].train_peak);
    CHECK(r.points[i].inference_peak < r.points[i - 1].inference_peak);
  }
  for (const SweepPoint& p : r.points) {
    CHECK(p.inference_peak >= p.parameter_bytes);  // the weights are part of it
    CHECK(p.train_peak > p.inference_peak);
    CHECK(p.ms_per_step > 0.0);
    CHECK(std::isfinite(p.quality_finetuned));
    CHECK(RunDir(p.run_dir).read_checkpoint_state().step == 5);  // 4 trained + 1 fine-tune step
  }
  CHECK(RunDir(r.points[1].run_dir).read_config().at("model").at("mlp_hidden") == nlohmann::json({64, 64}));
  std::ifstream csv(out + "/sweep.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header.rfind("amount,method,parameters,parameter_bytes,", 0) == 0);
  CHECK(header.find("val_loss_finetuned") != std::string::npos);
  int rows = 0;
  while (std::getline(csv, line)) rows += !line.empty();
  CHECK(rows == 3);
  std::stringstream html;
  html << std::ifstream(out + "/sweep.html").rdbuf();
  const std::string page = html.str();
  for (const char* id : {"chart-params", "chart-peaks", "chart-time", "chart-quality"})
    CHECK(page.find(id) != std::string::npos);
  CHECK(page.find("<script") == std::string::npos);  // self-contained: nothing loaded from elsewhere
  CHECK(page.find("<link") == std::string::npos);
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find("data-value=\"") != std::string::npos);
  CHECK(r.table().find("amount") != std::string::npos);

  // The command line: the table is printed, the unstructured sweep stores fewer bytes as it goes.
  run_prune_cli({"prune", "--run", run, "--out", tmp.file("sweep-u"), "--method", "unstructured", "--sweep", "0,0.8",
                 "--bench-steps", "2"});
  std::ifstream ucsv(tmp.file("sweep-u") + "/sweep.csv");
  std::getline(ucsv, header);
  std::vector<int64_t> stored;
  while (std::getline(ucsv, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    stored.push_back(std::stoll(cells.at(4)));
  }
  REQUIRE(stored.size() == 2);
  CHECK(stored[1] * 2 < stored[0]);
}

TEST_CASE("prune command: --sweep bad input is a clear error", "[prune][apps]") {
  CHECK_THROWS_WITH(parse_sweep("0,1"), Catch::Contains("must be in [0, 1)"));
  CHECK_THROWS_WITH(parse_sweep("0,-0.5"), Catch::Contains("must be in [0, 1)"));
  CHECK_THROWS_WITH(parse_sweep("0,half"), Catch::Contains("'half' is not a number"));
  CHECK_THROWS_WITH(parse_sweep("0.5x"), Catch::Contains("is not a number"));
  CHECK_THROWS_WITH(parse_sweep("0.5,0.5"), Catch::Contains("twice"));
  CHECK_THROWS_WITH(parse_sweep(""), Catch::Contains("at least one amount"));
  CHECK(parse_sweep("0,0.25,0.5,0.75") == std::vector<double>{0, 0.25, 0.5, 0.75});
}
