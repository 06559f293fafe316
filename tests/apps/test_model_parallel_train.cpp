// `gpt train` / `vision train` with the model split over devices (--devices, --split, --placement,
// --pipeline, per-device --memory-limit) as library calls and through the command line, on tiny
// models: the losses equal a single-device run's, each device's peaks reach metrics.csv and the
// result, a model over one budget trains when split over two such budgets, a split run resumes
// exactly, and bad combinations give one clear error before any work starts.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/gpt_train.h"
#include "apps/run_setup.h"
#include "apps/vision_train.h"
#include "core/allocator.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;

namespace {

GptTrainOptions tiny_gpt_options(const std::string& data, const std::string& out) {
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 4, .n_head = 2, .d_model = 32, .dropout = 0.1};
  o.data = data;
  o.out = out;
  o.steps = 4;
  o.batch = 4;
  o.lr = 1e-2;
  o.warmup = 1;
  o.eval_every = 4;
  o.eval_windows = 4;
  o.checkpoint_every = 2;
  o.progress = ProgressStyle::none;
  return o;
}

ModelParallelOptions split_over(const std::string& split, const std::string& devices) {
  ModelParallelOptions p;
  p.split = SplitSpec::parse(split);
  p.devices = parse_devices(devices);
  return p;
}

std::vector<std::string> losses(const std::string& run) { return metrics_column(run, "loss"); }

}  // namespace

TEST_CASE("gpt train --split: every split and both pipelines give the single-device losses", "[apps][parallel]") {
  DataTempDir tmp("mp_gpt_losses");
  const std::string data = write_tiny_token_file(tmp);
  const std::vector<std::string> want = losses(gpt_train(tiny_gpt_options(data, tmp.file("one"))).run_dir);
  REQUIRE(want.size() == 4);

  for (const std::string split : {"attention-mlp", "stages:2", "balanced"}) {
    INFO(split);
    GptTrainOptions o = tiny_gpt_options(data, tmp.file(split.substr(0, 5)));
    o.parallel = split_over(split, "cpu:3,cpu:4");
    const GptTrainResult r = gpt_train(o);
    CHECK(losses(r.run_dir) == want);  // dropout on: the same masks, bit for bit
    REQUIRE(r.device_peaks.size() == 2);
    CHECK(r.device_peaks[0].device == Device("cpu:3"));
    for (const DevicePeak& p : r.device_peaks) {
      CHECK(p.peak > 0);
      CHECK(p.of(MemoryCategory::parameter) > 0);
      CHECK(p.of(MemoryCategory::optimizer_state) > 0);
    }
    CHECK(metrics_column(r.run_dir, "peak_bytes@cpu:4").size() == 4);
    CHECK(std::stoll(metrics_column(r.run_dir, "peak_bytes@cpu:4").back()) > 0);
  }

  // Pipelines draw each micro-batch's dropout masks from a stream of its own (Note [Micro-batch
  // random streams]), so without dropout they equal the plain micro-batched run, and with it
  // GPipe and 1F1B equal each other.
  GptTrainOptions plain = tiny_gpt_options(data, tmp.file("plain"));
  plain.model->dropout = 0.0;
  plain.techniques.micro_batch = 2;
  const std::vector<std::string> want_plain = losses(gpt_train(plain).run_dir);
  for (const std::string kind : {"gpipe", "1f1b"}) {
    INFO(kind);
    GptTrainOptions o = plain;
    o.out = tmp.file("pipe-" + kind);
    o.parallel = split_over("stages:2", "cpu:3,cpu:4");
    o.parallel.pipeline = parse_pipeline(kind);
    CHECK(losses(gpt_train(o).run_dir) == want_plain);
  }
  std::vector<std::vector<std::string>> with_dropout;
  for (const std::string kind : {"gpipe", "1f1b"}) {
    GptTrainOptions o = tiny_gpt_options(data, tmp.file("dpipe-" + kind));
    o.techniques.micro_batch = 1;
    o.parallel = split_over("stages:2", "cpu:3,cpu:4");
    o.parallel.pipeline = parse_pipeline(kind);
    with_dropout.push_back(losses(gpt_train(o).run_dir));
  }
  CHECK(with_dropout[0] == with_dropout[1]);
}

TEST_CASE("gpt train --split tensor: single-device losses, half the block weights per device, exact resume",
          "[apps][parallel]") {
  DataTempDir tmp("mp_gpt_tensor");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions one = tiny_gpt_options(data, tmp.file("one"));
  one.model->dropout = 0.0;  // attention dropout draws its masks per device (Note in parallel/tensor_parallel.h)
  const std::vector<std::string> want = losses(gpt_train(one).run_dir);
  GptTrainOptions o = one;
  o.out = tmp.file("tensor");
  o.parallel = split_over("tensor", "cpu:3,cpu:4");
  const GptTrainResult r = gpt_train(o);
  const std::vector<std::string> got = losses(r.run_dir);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(std::stod(got[i]) - std::stod(want[i])) <= 2e-6 * std::abs(std::stod(want[i])));
  }
  REQUIRE(r.device_peaks.size() == 2);
  // cpu:4 holds half of every block's projection weights (4 x (3C^2 + C^2 + 8C^2) / 2 + biases),
  // cpu:3 the other half plus the embeddings, the LayerNorms and the c_proj biases.
  const int64_t C = 32, half = 4 * (12 * C * C + 3 * C + 4 * C) / 2 * 4;  // bytes, f32
  const DevicePeak& second = r.device_peaks[1];
  INFO("parameter bytes: " << r.device_peaks[0].of(MemoryCategory::parameter) << " / " << second.of(MemoryCategory::parameter));
  CHECK(double(second.of(MemoryCategory::parameter)) == Approx(double(half)).epsilon(0.05));
  CHECK(r.device_peaks[0].of(MemoryCategory::parameter) > second.of(MemoryCategory::parameter));
  CHECK(second.of(MemoryCategory::optimizer_state) > 0);
  // gpt sample gathers the shards into one model.
  const GptSampleResult s = gpt_sample({.run = r.run_dir, .prompt = "ab", .tokens = 6, .temperature = 0.0});
  CHECK(s.continuation.size() == 6);

  GptTrainOptions first = o;  // config.json keeps the split; the checkpoint holds the shards
  first.out = tmp.file("part");
  first.stop_after = 3;
  gpt_train(first);
  GptTrainOptions resume;
  resume.resume = tmp.file("part");
  resume.progress = ProgressStyle::none;
  const GptTrainResult rest = gpt_train(resume);
  CHECK(rest.first_step == 2);
  CHECK(losses(rest.run_dir) == got);
}

TEST_CASE("gpt train: a model over one device's budget trains when split over two such budgets", "[apps][parallel]") {
  DataTempDir tmp("mp_gpt_budget");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions one = tiny_gpt_options(data, tmp.file("one"));
  one.steps = 2;
  one.device = "cpu:5";
  const GptTrainResult single = gpt_train(one);
  const int64_t budget = single.peak_bytes * 3 / 4;  // below the single-device peak

  GptTrainOptions tight = one;
  tight.out = tmp.file("tight");
  tight.memory_limit = std::to_string(budget);
  CHECK_THROWS_AS(gpt_train(tight), OutOfMemoryError);
  set_memory_limit(Device("cpu:5"), 0);

  GptTrainOptions split = one;
  split.out = tmp.file("split");
  split.parallel = split_over("balanced", "cpu:5,cpu:6");
  split.memory_limit = "cpu:5=" + std::to_string(budget) + ",cpu:6=" + std::to_string(budget);
  const GptTrainResult r = gpt_train(split);
  CHECK(r.steps_done == 2);
  CHECK(losses(r.run_dir) == losses(single.run_dir));
  REQUIRE(r.device_peaks.size() == 2);
  for (const DevicePeak& p : r.device_peaks) CHECK(p.peak <= budget);
  CHECK(r.peak_bytes < single.peak_bytes * 3 / 4);
  set_memory_limit(Device("cpu:5"), 0);
  set_memory_limit(Device("cpu:6"), 0);

  // A budget the split cannot meet either: the error names the device and what lives there.
  GptTrainOptions tiny = split;
  tiny.out = tmp.file("tiny");
  tiny.memory_limit = "cpu:5=" + std::to_string(budget) + ",cpu:6=" + std::to_string(budget / 4);
  CHECK_THROWS_WITH(gpt_train(tiny), Catch::Contains("out of memory on cpu:6") && Catch::Contains("cpu:6 holds h."));
  set_memory_limit(Device("cpu:5"), 0);
  set_memory_limit(Device("cpu:6"), 0);
}

TEST_CASE("gpt train: a split, pipelined run resumes exactly and keeps its placement", "[apps][parallel]") {
  DataTempDir tmp("mp_gpt_resume");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions o = tiny_gpt_options(data, tmp.file("full"));
  o.techniques.micro_batch = 2;
  o.parallel.placement = Placement::parse("wte,wpe,h.0=cpu:3;h.1-3,ln_f=cpu:4");
  o.parallel.pipeline = PipelineKind::one_f_one_b;
  const GptTrainResult full = gpt_train(o);

  GptTrainOptions first = o;
  first.out = tmp.file("part");
  first.stop_after = 3;
  gpt_train(first);
  GptTrainOptions resume;
  resume.resume = tmp.file("part");
  resume.progress = ProgressStyle::none;
  const GptTrainResult rest = gpt_train(resume);
  CHECK(rest.first_step == 2);
  CHECK(rest.device_peaks.size() == 2);  // config.json kept the placement
  CHECK(losses(rest.run_dir) == losses(full.run_dir));
  CHECK(RunDir(tmp.file("part")).read_config().at("model_parallel").at("pipeline") == "1f1b");
}

TEST_CASE("vision train --split: stages and balanced give the single-device losses", "[apps][parallel]") {
  DataTempDir tmp("mp_vision");
  const std::string images = write_tiny_image_folder(tmp, 10);
  auto options = [&](const std::string& out) {
    VisionTrainOptions o;
    o.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8};
    o.data = images;
    o.out = tmp.file(out);
    o.epochs = 1;
    o.batch = 6;
    o.lr = 1e-2;
    o.progress = ProgressStyle::none;
    return o;
  };
  const VisionTrainResult one = vision_train(options("one"));
  for (const std::string split : {"stages:2", "balanced"}) {
    INFO(split);
    VisionTrainOptions o = options(split.substr(0, 5));
    o.parallel = split_over(split, "cpu:3,cpu:4");
    const VisionTrainResult r = vision_train(o);
    CHECK(losses(r.run_dir) == losses(one.run_dir));
    CHECK(r.test_accuracy == one.test_accuracy);
    CHECK(r.device_peaks.size() == 2);
  }
  VisionTrainOptions o = options("tensor");
  o.parallel = split_over("tensor", "cpu:3,cpu:4");
  CHECK_THROWS_WITH(vision_train(o), Catch::Contains("--split tensor slices a GPT's attention heads and MLP"));
}

TEST_CASE("model parallel flags: bad combinations give one clear error before any work", "[apps][parallel]") {
  DataTempDir tmp("mp_flags");
  const std::string data = write_tiny_token_file(tmp);
  const std::string out = tmp.file("bad");
  auto gpt = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"gpt", "train", "--data", data, "--out", out, "--steps", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    run_cli(args);
  };
  CHECK_THROWS_WITH(gpt({"--split", "balanced"}), Catch::Contains("--split balanced needs --devices"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4"}), Catch::Contains("--devices needs --split"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:3", "--split", "stages:2"}), Catch::Contains("--devices"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "halves"}), Catch::Contains("--split"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "stages:2", "--pipeline", "1f1b"}),
                    Catch::Contains("give --micro-batch"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "attention-mlp", "--pipeline", "gpipe", "--micro-batch", "2"}),
                    Catch::Contains("attention-mlp splits every block"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "stages:2", "--pipeline", "zigzag"}),
                    Catch::Contains("--pipeline"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "stages:2", "--memory-limit", "cpu:7=1MiB"}),
                    Catch::Contains("cpu:7 is not a device of this run"));
  CHECK_THROWS_WITH(gpt({"--placement", "wte,wpe,h.0-1=cpu:3;h.2-9,ln_f=cpu:4"}), Catch::Contains("h.4"));
  CHECK_THROWS_WITH(gpt({"--placement", "wte=cpu:3;ln_f=cpu:4"}), Catch::Contains("not placed"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "stages:2", "--placement", "wte=cpu:3"}),
                    Catch::Contains("--split and --placement"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,meta", "--split", "stages:2"}), Catch::Contains("meta"));
  CHECK_THROWS_WITH(gpt({"--print-schedule"}), Catch::Contains("--print-schedule needs --pipeline"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4,cpu:5", "--split", "tensor"}),  // gpt-mini: 4 heads
                    Catch::Contains("layer 0 has 4 attention heads, not divisible by 3 devices"));
  CHECK_THROWS_WITH(gpt({"--devices", "cpu:3,cpu:4", "--split", "tensor", "--pipeline", "1f1b", "--micro-batch", "2"}),
                    Catch::Contains("--split tensor slices every block"));
  CHECK_FALSE(std::filesystem::exists(RunDir(out).file("checkpoint")));
}
