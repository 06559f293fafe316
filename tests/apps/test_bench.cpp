// memgrad bench on tiny models: every combination runs, checkpointing and accumulation lower the
// activation peak, bf16-pure halves the parameter bytes, the ratios are against `none`, the csv
// and html are written, and bad combinations are errors naming the part.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/bench.h"
#include "apps_test_util.h"

using namespace mg;
using namespace mg::test;

TEST_CASE("memgrad bench: a tiny GPT under several combinations", "[apps]") {
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

TEST_CASE("memgrad bench: combinations are parsed strictly", "[apps]") {
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
  BenchOptions o;
  o.model = "resnet";
  CHECK_THROWS_WITH(run_bench(o), Catch::Contains("unknown --model 'resnet'"));
}
