// memgrad bench on tiny models: every combination runs, checkpointing and accumulation lower the
// activation peak, bf16-pure halves the parameter bytes, the ratios are against `none`, the csv
// and html are written, and bad combinations are errors naming the part. With --devices, split=
// and pipeline= rows get a peak per device in the table, bench.csv and bench.html.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/bench.h"
#include "apps_test_util.h"

using namespace mg;
using namespace mg::test;

TEST_CASE("memgrad bench: a tiny GPT under several combinations", "[apps][bench]") {
  DataTempDir dir("bench");
  BenchOptions o;
  o.gpt = GPTConfig{.vocab_size = 256, .context = 32, .n_layer = 4, .n_head = 2, .d_model = 32};
  o.data = write_tiny_token_file(dir);
  o.techniques = "none,ckpt,accum4,bf16pure,ckpt+bf16+accum4,offload,selective";
  o.steps = 3;
  o.batch = 8;
  o.out = dir.file("bench");
  o.progress = ProgressStyle::none;
  BenchResult r = run_bench(o);
  REQUIRE(r.rows.size() == 7);
  auto row = [&](const std::string& n) -> const BenchRow& {
    for (const auto& x : r.rows)
      if (x.name == n) return x;
    FAIL("no row " << n);
    return r.rows[0];
  };
  auto act = [](const BenchRow& x) { return x.memory.category[size_t(MemoryCategory::activation)]; };
  auto param = [](const BenchRow& x) { return x.memory.category[size_t(MemoryCategory::parameter)]; };
  INFO(r.table());
  CHECK(&r.baseline() == &row("none"));
  CHECK(act(row("ckpt")) * 2 < act(row("none")));
  CHECK(act(row("accum4")) * 2 < act(row("none")));
  CHECK(row("accum4").micro_batch == 2);
  CHECK(act(row("selective")) < act(row("none")));
  CHECK(act(row("offload")) < act(row("none")));
  CHECK(double(param(row("bf16pure"))) < 0.6 * double(param(row("none"))));  // 16-bit (+ 512 B rounding)
  CHECK(act(row("ckpt+bf16+accum4")) * 4 < act(row("none")));
  for (const auto& x : r.rows) {
    CHECK(std::isfinite(x.loss));
    CHECK(x.ms_per_step > 0);
    CHECK(x.memory.peak >= act(x));
  }
  // The files.
  std::ifstream csv(o.out + "/bench.csv");
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  CHECK(lines == 8);
  std::ifstream html(o.out + "/bench.html");
  std::stringstream ss;
  ss << html.rdbuf();
  CHECK(ss.str().find("<svg id=\"bench-chart\"") != std::string::npos);
  CHECK(ss.str().find("data-category=\"activation\"") != std::string::npos);
  // Each bar is the row's real peak (its segments sum to it), on a labelled axis.
  CHECK(ss.str().find("class=\"peak\" data-bytes=\"" + std::to_string(row("none").memory.peak) + "\"") !=
        std::string::npos);
  int64_t at_peak = 0;
  for (int64_t b : row("none").memory.at_peak) at_peak += b;
  CHECK(at_peak == row("none").memory.peak);
  CHECK(ss.str().find("peak allocated (MiB)") != std::string::npos);
  // A benchmark writes no training checkpoints; its table says what its times are medians of.
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.out))
    CHECK(e.path().filename() != "checkpoint");
  CHECK(r.table().find("median of 2 steps") != std::string::npos);
  CHECK(r.table().find("warning: the times are medians of fewer than 5 steps") != std::string::npos);
  CHECK(row("offload").offloaded_bytes > 0);
  CHECK(row("none").offloaded_bytes == 0);
  CHECK(ss.str().find("ckpt+bf16+accum4") != std::string::npos);
  CHECK_THROWS_WITH(run_bench(o), Catch::Contains("already holds a bench.csv"));
}

TEST_CASE("memgrad bench: adam8bit trains with 8-bit AdamW moments, the same loss to 1%", "[apps][bench][adam8bit]") {
  DataTempDir dir("bench_adam8bit");
  BenchOptions o;
  // d_model 64: every weight matrix and the embeddings have 4096+ elements (8-bit moments).
  o.gpt = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 64};
  o.data = write_tiny_token_file(dir);
  o.techniques = "none,adam8bit,ckpt+adam8bit";
  o.steps = 4;
  o.batch = 4;
  o.out = dir.file("bench");
  o.progress = ProgressStyle::none;
  const BenchResult r = run_bench(o);
  INFO(r.table());
  REQUIRE(r.rows.size() == 3);
  auto optim = [](const BenchRow& x) { return double(x.memory.category[size_t(MemoryCategory::optimizer_state)]); };
  CHECK(optim(r.rows[1]) < 0.3 * optim(r.rows[0]));  // 2 B a parameter + block scales, against 8 B
  CHECK(optim(r.rows[2]) == optim(r.rows[1]));
  CHECK(r.rows[1].memory.peak < r.rows[0].memory.peak);
  CHECK(r.rows[1].loss == Approx(r.rows[0].loss).epsilon(0.01));
  CHECK(r.rows[2].loss == r.rows[1].loss);  // checkpointing keeps the bits
}

TEST_CASE("memgrad bench: combinations are parsed strictly", "[apps][bench]") {
  const Device cpu0 = kCPU;
  Combination c = parse_combination("ckpt+bf16+accum4", 8, cpu0);
  CHECK(c.techniques.checkpoint.str() == "blocks");
  CHECK(c.techniques.precision == Precision::bf16);
  CHECK(c.techniques.micro_batch == 2);
  CHECK(parse_combination("offload", 8, cpu0).techniques.offload_activations == Device("cpu:1"));
  CHECK(parse_combination("ckpt-every2", 8, cpu0).techniques.checkpoint.str() == "every:2");
  CHECK_THROWS_WITH(parse_combination("ckpt+quantum", 8, cpu0), Catch::Contains("unknown technique 'quantum'"));
  CHECK_THROWS_WITH(parse_combination("accum3", 8, cpu0), Catch::Contains("does not divide"));
  CHECK_THROWS_WITH(parse_combination("bf16+fp16", 8, cpu0), Catch::Contains("two precisions"));
  CHECK_THROWS_WITH(parse_combinations("none,none", 8, cpu0), Catch::Contains("appears twice"));
  CHECK(parse_combination("ckpt+adam8bit", 8, cpu0).optimizer == OptimizerKind::adamw8bit);
  CHECK(parse_combination("ckpt+adam8bit", 8, cpu0).optimizer_for(OptimizerKind::adamw) == OptimizerKind::adamw8bit);
  CHECK(!parse_combination("ckpt", 8, cpu0).optimizer);
  CHECK_THROWS_WITH(parse_combination("adam8bit+adamw8bit", 8, cpu0), Catch::Contains("names adam8bit twice"));
  CHECK_THROWS_WITH(parse_combination("bf16pure+adam8bit", 8, cpu0), Catch::Contains("adam8bit updates f32 parameters"));
  BenchOptions o;
  o.model = "resnet";
  CHECK_THROWS_WITH(run_bench(o), Catch::Contains("unknown --model 'resnet'"));
}

TEST_CASE("memgrad bench: ddp= and zeroS= are parsed strictly and need mpirun with as many ranks", "[apps][bench]") {
  const Device cpu0 = kCPU;
  const Combination c = parse_combination("ckpt+zero2=2", 8, cpu0);
  CHECK(c.ranks == 2);
  CHECK(c.zero == 2);
  CHECK(parse_combination("ddp=4", 8, cpu0).zero == 0);
  CHECK(parse_combination("zero1=8", 8, cpu0).zero == 1);
  CHECK(parse_combination("ckpt", 8, cpu0).ranks == 0);
  CHECK_THROWS_WITH(parse_combination("ddp=3", 8, cpu0), Catch::Contains("does not divide"));
  CHECK_THROWS_WITH(parse_combination("zero2=", 8, cpu0), Catch::Contains("needs a whole number of ranks, e.g. zero2=2"));
  CHECK_THROWS_WITH(parse_combination("accum2+ddp=8", 8, cpu0), Catch::Contains("larger than each rank's 1 rows"));
  BenchOptions o;
  o.gpt = GPTConfig{.vocab_size = 64, .context = 8, .n_layer = 1, .n_head = 2, .d_model = 16, .dropout = 0.0};
  o.techniques = "none,zero2=2";
  o.out = (std::filesystem::temp_directory_path() / "memgrad-bench-zero-without-ddp").string();
  std::filesystem::remove_all(o.out);
  CHECK_THROWS_WITH(run_bench(o), Catch::Contains("'zero2=2' trains over 2 ranks; run it under mpirun -np 2 with --ddp"));
  CHECK_FALSE(std::filesystem::exists(o.out));  // refused before any row ran
}

TEST_CASE("memgrad bench: split= and pipeline= are parsed strictly", "[apps][bench][parallel]") {
  const Device cpu0 = kCPU;
  const std::vector<Device> two = {Device("cpu:3"), Device("cpu:4")};
  Combination c = parse_combination("split=balanced+pipeline=1f1b+accum4", 8, cpu0, two);
  REQUIRE(c.parallel.split);
  CHECK(c.parallel.split->str() == "balanced");
  CHECK(c.parallel.pipeline == PipelineKind::one_f_one_b);
  CHECK(c.parallel.devices == two);
  CHECK(c.techniques.micro_batch == 2);
  CHECK(parse_combination("split=stages:2+ckpt", 8, cpu0, two).parallel.split->stages == 2);
  CHECK(parse_combination("split=tensor", 8, cpu0, two).parallel.split->kind == SplitSpec::Kind::tensor);
  CHECK_FALSE(parse_combination("ckpt", 8, cpu0, two).parallel.active());
  CHECK_THROWS_WITH(parse_combination("split=balanced", 8, cpu0), Catch::Contains("give them, e.g. --devices cpu:0,cpu:1"));
  CHECK_THROWS_WITH(parse_combination("split=halves", 8, cpu0, two),
                    Catch::Contains("'split=halves' in 'split=halves'") && Catch::Contains("unknown strategy"));
  CHECK_THROWS_WITH(parse_combination("split=stages:2+pipeline=zigzag+accum2", 8, cpu0, two),
                    Catch::Contains("'pipeline=zigzag'"));
  CHECK_THROWS_WITH(parse_combination("split=stages:2+pipeline=1f1b", 8, cpu0, two), Catch::Contains("add accumN"));
  CHECK_THROWS_WITH(parse_combination("pipeline=1f1b+accum2", 8, cpu0, two), Catch::Contains("add split=stages:K"));
  CHECK_THROWS_WITH(parse_combination("split=tensor+pipeline=gpipe+accum2", 8, cpu0, two),
                    Catch::Contains("--split tensor slices every block"));
  CHECK_THROWS_WITH(parse_combination("split=balanced+split=tensor", 8, cpu0, two), Catch::Contains("names two splits"));
  CHECK_THROWS_WITH(parse_combination("split=balanced", 8, cpu0, {Device("cpu:3")}),
                    Catch::Contains("needs --devices with at least two devices"));
  CHECK_THROWS_WITH(parse_combinations("none,ckpt", 8, cpu0, two), Catch::Contains("none of --techniques does"));
}

TEST_CASE("memgrad bench --devices: a tiny GPT split over two devices, a peak column per device", "[apps][bench][parallel]") {
  DataTempDir dir("bench_devices");
  BenchOptions o;
  o.gpt = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 4, .n_head = 2, .d_model = 32};
  o.data = write_tiny_token_file(dir);
  o.techniques = "none,split=balanced,split=stages:2+pipeline=1f1b+accum4";
  o.steps = 2;
  o.batch = 4;
  o.device = "cpu:3";
  o.devices = {Device("cpu:3"), Device("cpu:4")};
  o.out = dir.file("bench");
  o.progress = ProgressStyle::none;
  const BenchResult r = run_bench(o);
  const std::string table = r.table();
  INFO(table);
  REQUIRE(r.rows.size() == 3);
  CHECK(r.device_columns == o.devices);
  const BenchRow& one = r.rows[0];
  REQUIRE(one.device_peaks.size() == 1);
  CHECK(one.on(Device("cpu:3"))->peak == one.memory.peak);
  CHECK(one.on(Device("cpu:4")) == nullptr);
  for (size_t i = 1; i < 3; ++i) {
    const BenchRow& row = r.rows[i];
    REQUIRE(row.device_peaks.size() == 2);
    int64_t larger = 0;
    for (const DevicePeak& p : row.device_peaks) {
      CHECK(p.of(MemoryCategory::parameter) > 0);
      CHECK(p.peak < one.memory.peak);  // each device holds part of the model
      larger = std::max(larger, p.peak);
    }
    CHECK(row.memory.peak == larger);  // the row's total is the largest device's
  }
  CHECK(r.rows[2].micro_batch == 1);
  CHECK_THAT(table, Catch::Contains("@cpu:3") && Catch::Contains("@cpu:4") && Catch::Contains("wte,wpe,h."));
  // bench.csv: the split and a peak per device ("" where a row did not use the device).
  const auto rows = read_metrics(o.out + "/bench.csv");
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].at("peak_bytes@cpu:4").empty());
  CHECK(rows[0].at("peak_bytes@cpu:3") == std::to_string(one.memory.peak));
  CHECK(rows[1].at("split") == "balanced");
  CHECK(rows[2].at("pipeline") == "1f1b");
  CHECK(rows[2].at("peak_bytes@cpu:4") == std::to_string(r.rows[2].on(Device("cpu:4"))->peak));
  CHECK(rows[1].at("peak_parameter_bytes@cpu:4") ==
        std::to_string(r.rows[1].on(Device("cpu:4"))->of(MemoryCategory::parameter)));
  std::ifstream html(o.out + "/bench.html");
  std::stringstream ss;
  ss << html.rdbuf();
  CHECK(ss.str().find("class=\"device-peak\" data-device=\"cpu:4\" data-bytes=\"" +
                      std::to_string(r.rows[1].on(Device("cpu:4"))->peak) + "\"") != std::string::npos);

  BenchOptions bad = o;
  bad.out = dir.file("bad");
  bad.devices = {};
  CHECK_THROWS_WITH(run_bench(bad), Catch::Contains("splits the model over --devices"));
}
