// `memgrad quantize` as a library call on tiny runs: a vision run quantized with PTQ (weight bytes
// smaller, accuracy and throughput reported, the file loads back into a model that reproduces
// the reported accuracy's predictions), a gpt run weight-only (val loss close to fp32), QAT with
// observed and learned scales (their learning rate a factor of the weights'), and the bad inputs: an already quantized run, zero calibration
// batches, an unknown observer, mode or --qat-scales, an existing --out, a corrupt quantized file.
#include <catch2/catch.hpp>
#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/commands.h"
#include "apps/gpt_train.h"
#include "apps/quantize.h"
#include "apps/vision_train.h"
#include "models/compress/qat.h"
#include "models/compress/quant_format.h"
#include "models/mobilenet_v2.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

TEST_CASE("quantize: a vision run with PTQ, then the bad inputs", "[apps][quant]") {
  DataTempDir tmp("quantize_vision");
  const std::string images = write_tiny_image_folder(tmp, 20);
  VisionTrainOptions t;
  t.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8};
  t.data = images;
  t.out = tmp.file("fp32");
  t.batch = 12;
  t.lr = 1e-2;
  t.progress = ProgressStyle::none;
  vision_train(t);

  QuantizeResult r = quantize_run({.run = tmp.file("fp32"), .out = tmp.file("int8"), .calibrate = 2, .observer = "ema"});
  CHECK(r.model == "mobilenetv2");
  CHECK(r.examples == 4);
  CHECK((r.fp32_metric >= 0 && r.fp32_metric <= 1 && r.int8_metric >= 0 && r.int8_metric <= 1));
  CHECK(r.int8_weight_bytes * 3 < r.fp32_weight_bytes);
  CHECK((r.fp32_per_s > 0 && r.int8_per_s > 0));
  CHECK(fs::exists(tmp.file("int8/config.json")));
  const LoadedQuantizedModel l = load_quantized(r.file);
  CHECK(l.info.calibration.at("observer") == "ema");
  CHECK(l.info.calibration.at("batches") == 2);
  CHECK(RunDir(tmp.file("int8")).read_config().at("quantized").at("int8_weight_bytes") == r.int8_weight_bytes);

  // bad inputs
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("int8"), .out = tmp.file("again")}),
                    Catch::Contains("already a quantized run"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .calibrate = 0}),
                    Catch::Contains("--calibrate 0") && Catch::Contains("at least one calibration batch"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .observer = "histogram"}),
                    Catch::Contains("unknown observer 'histogram'"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = "qtt"}),
                    Catch::Contains("--mode 'qtt' is not supported (known: ptq, qat)"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("int8")}), Catch::Contains("already exists"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("nothing"), .out = tmp.file("z")}),
                    Catch::Contains("not a run directory"));
  // a corrupt quantized file: truncated
  fs::resize_file(r.file, fs::file_size(r.file) - 100);
  CHECK_THROWS_WITH(load_quantized(r.file), Catch::Contains(kQuantizedModelFile));
  CHECK(!fs::exists(tmp.file("z")));

  // the command line registers and prints
  CLI::App app{"memgrad"};
  add_quantize_command(app);
  std::vector<std::string> args = {"quantize", "--run", tmp.file("fp32"), "--out", tmp.file("cli"), "--calibrate", "1"};
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
  CHECK(fs::exists(tmp.file("cli/") + kQuantizedModelFile));
}

namespace {

// A tiny MobileNetV2 trained on 20 images into tmp/fp32, the source run of the QAT tests.
void train_tiny_vision_run(DataTempDir& tmp) {
  VisionTrainOptions t;
  t.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8};
  t.data = write_tiny_image_folder(tmp, 20);
  t.out = tmp.file("fp32");
  t.batch = 12;
  t.lr = 1e-2;
  t.progress = ProgressStyle::none;
  vision_train(t);
}

}  // namespace

TEST_CASE("quantize --mode qat: fine-tunes, converts, evaluates, bad flags", "[apps][quant][qat]") {
  DataTempDir tmp("quantize_qat");
  train_tiny_vision_run(tmp);

  QuantizeOptions q{.run = tmp.file("fp32"), .out = tmp.file("qat"), .mode = "qat", .qat_steps = 2};
  q.techniques.micro_batch = 6;  // with gradient accumulation
  const QuantizeResult r = quantize_run(q);
  CHECK(r.observer == "ema");
  CHECK((std::isfinite(r.qat_first_loss) && std::isfinite(r.qat_last_loss)));
  CHECK(r.int8_weight_bytes * 3 < r.fp32_weight_bytes);
  const LoadedQuantizedModel l = load_quantized(r.file);
  CHECK(l.info.scheme == "int8_qat");
  CHECK(l.info.calibration.at("qat_steps") == 2);
  // vision eval runs the int8 model of the quantized run and reproduces quantize's accuracy
  const VisionEvalResult e = vision_eval({.run = tmp.file("qat")});
  CHECK(e.scheme == "int8_qat");
  CHECK(e.accuracy == Approx(r.int8_metric));
  CHECK(e.weight_bytes == r.int8_weight_bytes);
  CHECK(e.fp32_weight_bytes == r.fp32_weight_bytes);
  CHECK(l.info.calibration.at("qat_scales") == "observed");  // the default

  // --qat-scales learned (LSQ), from the command line: recorded in the file and the run's config
  CLI::App app{"memgrad"};
  add_quantize_command(app);
  std::vector<std::string> args = {"quantize", "--run", tmp.file("fp32"), "--out", tmp.file("lsq"), "--mode", "qat",
                                   "--qat-steps", "2", "--qat-scales", "learned"};
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
  CHECK(load_quantized(tmp.file("lsq/") + kQuantizedModelFile).info.calibration.at("qat_scales") == "learned");
  CHECK(RunDir(tmp.file("lsq")).read_config().at("quantized").at("calibration").at("qat_scales") == "learned");
  const VisionEvalResult el = vision_eval({.run = tmp.file("lsq")});
  CHECK(el.scheme == "int8_qat");
  CHECK((el.accuracy >= 0 && el.accuracy <= 1));

  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = "qat", .qat_steps = 1,
                                  .qat_scales = "lsq"}),
                    Catch::Contains("--qat-scales 'lsq' is not supported (known: observed, learned)"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .qat_scales = "learned"}),
                    Catch::Contains("--qat-scales is for --mode qat"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = "qat"}),
                    Catch::Contains("--mode qat needs --qat-steps N with N >= 1"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = "qat", .observer = "percentile",
                                  .qat_steps = 1}),
                    Catch::Contains("--observer percentile is not available with --mode qat"));
  QuantizeOptions pure{.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = "qat", .qat_steps = 1};
  pure.techniques.precision = Precision::bf16_pure;
  CHECK_THROWS_WITH(quantize_run(pure), Catch::Contains("--precision bf16-pure is not available with --mode qat"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .qat_steps = 3}),
                    Catch::Contains("--qat-steps is for --mode qat"));
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("qat"), .out = tmp.file("z"), .mode = "qat", .qat_steps = 1}),
                    Catch::Contains("already a quantized run"));
  QuantizeOptions g{.run = tmp.file("fp32"), .out = tmp.file("z")};
  g.gpt_mode = "int8-outlier";
  CHECK_THROWS_WITH(quantize_run(g), Catch::Contains("--gpt-mode is for gpt runs"));
  CHECK(!fs::exists(tmp.file("z")));
}

TEST_CASE("quantize: a gpt run, weight-only int8", "[apps][quant]") {
  DataTempDir tmp("quantize_gpt");
  GptTrainOptions t;
  t.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32};
  t.data = write_tiny_token_file(tmp);
  t.out = tmp.file("fp32");
  t.steps = 4;
  t.batch = 4;
  t.eval_windows = 4;
  t.progress = ProgressStyle::none;
  gpt_train(t);
  QuantizeResult r = quantize_run({.run = tmp.file("fp32"), .out = tmp.file("int8"), .eval_windows = 4});
  CHECK(r.model == "gpt");
  CHECK(r.metric == "val loss");
  CHECK(std::abs(r.int8_metric - r.fp32_metric) < 0.02 * r.fp32_metric);
  CHECK(r.int8_weight_bytes < r.fp32_weight_bytes);
  CHECK(load_quantized(r.file).info.layers.size() == 4);
  CHECK_THROWS_WITH(quantize_run({.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = "qat", .qat_steps = 1}),
                    Catch::Contains("available for vision runs only"));
  // LLM.int8()-style: int8 GEMM with outlier columns in f32
  QuantizeOptions o{.run = tmp.file("fp32"), .out = tmp.file("outlier"), .eval_windows = 4};
  o.gpt_mode = "int8-outlier";
  const QuantizeResult ro = quantize_run(o);
  CHECK(std::abs(ro.int8_metric - ro.fp32_metric) < 0.05 * ro.fp32_metric);
  CHECK((ro.outlier_column_share >= 0 && ro.outlier_column_share <= 1));
  CHECK(load_quantized(ro.file).info.scheme == "int8_outlier");
  // gpt eval and sample run the int8 model from the file, next to the fp32 source run
  const GptEvalResult fp32 = gpt_eval({.run = tmp.file("fp32"), .windows = 4});
  for (const char* dir : {"int8", "outlier"}) {
    INFO(dir);
    const GptEvalResult e = gpt_eval({.run = tmp.file(dir), .windows = 4});
    CHECK(e.scheme == (std::string(dir) == "int8" ? "int8_weight_only" : "int8_outlier"));
    CHECK(e.loss != fp32.loss);  // the int8 model, not the fp32 one
    CHECK(std::abs(e.loss - fp32.loss) < 0.05 * fp32.loss);
    CHECK(e.fp32_loss == fp32.loss);
    CHECK(e.fp32_weight_bytes == fp32.weight_bytes);
    CHECK(e.weight_bytes < e.fp32_weight_bytes);
    CHECK((e.tokens_per_s > 0 && e.fp32_tokens_per_s > 0 && e.peak_bytes > 0 && e.fp32_peak_bytes > 0));
    const GptSampleResult sm = gpt_sample({.run = tmp.file(dir), .prompt = "ab", .tokens = 5, .temperature = 0});
    CHECK(sm.continuation.size() == 5);
  }
  CHECK(std::isnan(fp32.fp32_loss));
  CHECK(fp32.scheme.empty());
  o.out = tmp.file("z");
  o.gpt_mode = "int4";
  CHECK_THROWS_WITH(quantize_run(o), Catch::Contains("--gpt-mode 'int4' is not supported"));
  o.gpt_mode = "int8-outlier";
  o.outlier_threshold = -1;
  CHECK_THROWS_WITH(quantize_run(o), Catch::Contains("--outlier-threshold must be >= 0"));
}

TEST_CASE("quantize --qat-scale-lr: the learned scales step at a factor of the weights' rate and undecayed",
          "[apps][quant][qat]") {
  // The optimizer: a group of their own whose ratio survives the schedule's set_lr.
  Generator gen(3);
  MobileNetV2 m(MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8},
                InitOptions{.gen = &gen});
  m.eval();
  fold_batch_norms(m);
  prepare_qat(m, {.scales = QatScales::learned});
  const NamedTensors scales = learned_qat_scales(m);
  REQUIRE(!scales.empty());
  TrainOptions t;
  t.lr = 2e-3;
  t.weight_decay = 0.05;
  const std::unique_ptr<Optimizer> opt = qat_optimizer(t, m, 0.1);
  const ParamGroup* sg = nullptr;
  size_t total = 0;
  for (const ParamGroup& g : opt->param_groups()) {
    total += g.params.size();
    if (g.name == "qat_scales") sg = &g;
    else
      for (const auto& np : g.params)
        CHECK(std::none_of(scales.begin(), scales.end(), [&](const auto& s) { return s.first == np.first; }));
  }
  REQUIRE(sg != nullptr);
  CHECK(total == m.named_parameters().size());
  CHECK(sg->params.size() == scales.size());
  CHECK(sg->weight_decay == 0.0);
  CHECK(sg->lr == Approx(2e-4));
  opt->set_lr(1e-3);  // a schedule's step keeps the factor
  CHECK(opt->lr() == Approx(1e-3));
  CHECK(sg->lr == Approx(1e-4));
  // observed scales are not parameters: no scales group
  Generator gen2(3);
  MobileNetV2 m2(MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8},
                 InitOptions{.gen = &gen2});
  m2.eval();
  fold_batch_norms(m2);
  prepare_qat(m2, {});
  CHECK(learned_qat_scales(m2).empty());
  const std::unique_ptr<Optimizer> opt2 = qat_optimizer(t, m2, 1.0);
  for (const ParamGroup& g : opt2->param_groups()) CHECK(g.name != "qat_scales");

  // The command: factor 1 is what learned scales did before the flag; 0.1 trains them less.
  DataTempDir tmp("quantize_qat_scale_lr");
  train_tiny_vision_run(tmp);
  auto qat = [&](const char* out, std::optional<double> f) {
    QuantizeOptions q{.run = tmp.file("fp32"), .out = tmp.file(out), .mode = "qat", .qat_steps = 3, .qat_lr = 1e-2,
                      .qat_scales = "learned"};
    q.qat_scale_lr = f;
    manual_seed(11);  // the classifier's dropout draws from the default generator
    quantize_run(q);
    return load_quantized(tmp.file(out) + "/" + kQuantizedModelFile);
  };
  auto scale_tensors = [](const LoadedQuantizedModel& l) {  // every value of the int8 model
    std::vector<double> v;
    for (const NamedTensors& ts : {l.model->named_parameters(), l.model->named_buffers()})
      for (const auto& [n, t] : ts)
        for (double x : cast(t, DType::f64).to_vector<double>()) v.push_back(x);
    return v;
  };
  const LoadedQuantizedModel none = qat("none", std::nullopt), one = qat("one", 1.0), tenth = qat("tenth", 0.1);
  CHECK(scale_tensors(none) == scale_tensors(one));
  CHECK(scale_tensors(none) != scale_tensors(tenth));
  CHECK(tenth.info.calibration.at("qat_scale_lr") == Approx(0.1));
  CHECK(!none.info.calibration.contains("qat_scale_lr"));

  // Bad values and combinations
  auto bad = [&](std::optional<double> f, const char* mode, const char* scales) {
    QuantizeOptions q{.run = tmp.file("fp32"), .out = tmp.file("z"), .mode = mode, .qat_steps = std::string(mode) == "qat" ? 1 : 0,
                      .qat_scales = scales};
    q.qat_scale_lr = f;
    return q;
  };
  for (double f : {0.0, -1.0, std::nan(""), double(INFINITY)})
    CHECK_THROWS_WITH(quantize_run(bad(f, "qat", "learned")), Catch::Contains("--qat-scale-lr must be a positive finite factor"));
  CHECK_THROWS_WITH(quantize_run(bad(0.5, "qat", "observed")), Catch::Contains("--qat-scale-lr needs --qat-scales learned"));
  CHECK_THROWS_WITH(quantize_run(bad(0.5, "qat", "")), Catch::Contains("--qat-scale-lr needs --qat-scales learned"));
  CHECK_THROWS_WITH(quantize_run(bad(0.5, "ptq", "")), Catch::Contains("--qat-scale-lr is for --mode qat"));
  CLI::App app{"memgrad"};
  add_quantize_command(app);
  std::vector<std::string> args = {"quantize", "--run", tmp.file("fp32"), "--out", tmp.file("z"), "--mode", "qat",
                                   "--qat-steps", "1", "--qat-scales", "learned", "--qat-scale-lr", "fast"};
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  CHECK_THROWS_AS(app.parse(reversed), CLI::ParseError);
  CHECK(!fs::exists(tmp.file("z")));
}
