// memgrad plan: the meta rows equal the same steps run on cpu:0 (--verify), "fits" agrees with
// running under the budget, the recommendation is the fastest estimate that fits, and bad input
// (a budget below the parameters, unknown models and techniques) gets a clear error.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "apps/cost_model.h"
#include "apps/plan.h"
#include "core/allocator.h"
#include "core/error.h"
#include "ops/cpu_gemm.h"
#include "plan_test_util.h"

using namespace mg;

using mg::test::tiny_gpt;
using mg::test::use_test_cache;

TEST_CASE("plan: every row's meta peak equals the step run on cpu:0, and fits agrees with a budgeted run", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.techniques = "none,ckpt,bf16,bf16pure+accum2,ckpt-sqrt+offload,selective+accum4,adam8bit,ckpt+bf16+adam8bit";
  o.verify = true;
  // Unbounded first: every row fits, and measured peaks equal the estimates byte for byte.
  Plan all = make_plan(o);
  REQUIRE(all.rows.size() == 8);
  // adam8bit trains with AdamW8bit: its optimizer state is the smaller one (1 byte a moment, f32
  // for tensors under 4096 elements).
  auto optim = [](const PlanRow& r) { return r.memory.category[size_t(MemoryCategory::optimizer_state)]; };
  CHECK(optim(all.rows[6]) < optim(all.rows[0]));
  CHECK(all.rows[6].combination.optimizer == OptimizerKind::adamw8bit);
  int64_t lo = all.rows.front().memory.peak, hi = lo;
  for (const PlanRow& r : all.rows) {
    INFO(r.combination.name);
    REQUIRE(r.measured.has_value());
    CHECK(r.fits);
    CHECK(r.measured->peak == r.memory.peak);
    for (MemoryCategory c : kAllMemoryCategories) CHECK(r.measured->category[size_t(c)] == r.memory.category[size_t(c)]);
    CHECK(r.estimated_ms > 0);
    CHECK(r.flops.total() > 0);
    lo = std::min(lo, r.memory.peak), hi = std::max(hi, r.memory.peak);
  }
  REQUIRE(all.recommended >= 0);
  for (const PlanRow& r : all.rows) CHECK(all.rows[size_t(all.recommended)].estimated_ms <= r.estimated_ms);
  // A budget between the smallest and the largest peak: some fit, some do not, and each verdict
  // is what a run under that budget on cpu:0 does.
  o.memory_limit = std::to_string((lo + hi) / 2);
  Plan some = make_plan(o);
  int fit = 0;
  for (const PlanRow& r : some.rows) {
    INFO(r.combination.name << " peak " << r.memory.peak << " reserved " << r.memory.reserved);
    CHECK(r.fits == r.measured_fits);
    fit += r.fits;
  }
  CHECK(fit > 0);
  CHECK(fit < int(some.rows.size()));
  REQUIRE(some.recommended >= 0);
  CHECK(some.rows[size_t(some.recommended)].fits);
  const nlohmann::json j = some.to_json();
  REQUIRE(j.size() == some.rows.size());
  for (size_t i = 0; i < j.size(); ++i) {
    for (const char* key : {"combination", "peak_bytes", "peak_activation_bytes", "peak_parameter_bytes", "fits",
                            "ms_per_step"})
      CHECK(j[i].contains(key));
    CHECK(j[i].contains("measured_peak_bytes") == some.rows[i].fits);  // the rest ran out of memory
  }
  CHECK(some.table().find("recommended (*): ") != std::string::npos);
}

TEST_CASE("plan: split rows give every device's peak and it equals the split step run on cpu:0 and cpu:1", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.devices = {Device("cpu:0"), Device("cpu:1")};
  o.verify = true;
  for (const bool gpt : {true, false}) {
    if (gpt) {  // large enough that the budgets pass the allocator's first 2 MiB segments
      PlanWorkload w = tiny_gpt();
      w.gpt = GPTConfig{.vocab_size = 256, .context = 64, .n_layer = 2, .n_head = 2, .d_model = 128, .dropout = 0.1};
      w.batch = 8;
      o.workload = w;
      o.techniques = "none,split=attention-mlp,split=stages:2,split=balanced,split=tensor,ckpt+bf16+split=balanced,"
                     "accum2+split=stages:2";
    } else {
      PlanWorkload w;
      w.name = "tiny-mobilenet";
      w.mobilenet = MobileNetV2Config{.width_mult = 0.5, .num_classes = 10, .small_input = true, .input_size = 16};
      w.batch = 8;
      w.prefetch = 2;
      o.workload = w;
      o.techniques = "none,split=stages:2,split=balanced,bf16+split=balanced,ckpt+accum2+split=stages:2";
    }
    o.memory_limit.clear();
    const Plan all = make_plan(o);
    int64_t lo = all.rows.front().memory.peak, hi = lo;
    for (const PlanRow& r : all.rows) {
      INFO(r.combination.name);
      const bool split = r.combination.parallel.active();
      REQUIRE(r.devices.size() == (split ? 2u : 0u));
      REQUIRE(r.measured_devices.size() == r.devices.size());
      for (size_t k = 0; k < r.devices.size(); ++k) {
        INFO(r.devices[k].device.str() << " holds " << r.devices[k].modules);
        CHECK(r.devices[k].device == o.devices[k]);  // named by the real devices, not meta's
        CHECK(r.measured_devices[k].device == o.devices[k]);
        CHECK(r.measured_devices[k].memory.peak == r.devices[k].memory.peak);
        for (MemoryCategory c : kAllMemoryCategories)
          CHECK(r.measured_devices[k].memory.category[size_t(c)] == r.devices[k].memory.category[size_t(c)]);
        CHECK(r.devices[k].memory.category[size_t(MemoryCategory::parameter)] > 0);  // both devices hold weights
        CHECK(r.devices[k].memory.peak <= r.memory.peak);                           // the row is the fullest device
      }
      if (split) CHECK(r.memory.peak < all.rows.front().memory.peak);  // a split spreads the step's memory
      lo = std::min(lo, r.memory.peak), hi = std::max(hi, r.memory.peak);
    }
    // A budget on every device between the least and the most: each verdict is what the split
    // step does under it on the real devices, and the rows that ran equal the plan there too.
    o.memory_limit = std::to_string((lo + hi) / 2);
    const Plan some = make_plan(o);
    int fit = 0;
    for (const PlanRow& r : some.rows) {
      INFO(r.combination.name << " peak " << r.memory.peak << " reserved " << r.memory.reserved);
      CHECK(r.fits == r.measured_fits);
      fit += r.fits;
      if (r.fits && !r.devices.empty())
        for (size_t k = 0; k < r.devices.size(); ++k)
          CHECK(r.measured_devices[k].memory.peak == r.devices[k].memory.peak);
    }
    INFO(some.table());
    CHECK(fit > 0);
    CHECK(fit < int(some.rows.size()));
    const nlohmann::json j = some.to_json();
    for (size_t i = 0; i < j.size(); ++i)
      if (some.rows[i].combination.parallel.active()) {
        REQUIRE(j[i].contains("devices"));
        CHECK(j[i]["devices"].size() == 2);
        CHECK(j[i]["devices"][1]["device"] == "cpu:1");
        CHECK(j[i]["devices"][0].contains("peak_activation_bytes"));
      }
    CHECK(some.table().find("  cpu:1 ") != std::string::npos);
  }
}

TEST_CASE("plan: per-device budgets hold each device of a split to its own, as the split step under them does", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.devices = {Device("cpu:0"), Device("cpu:1")};
  PlanWorkload w = tiny_gpt();
  w.gpt = GPTConfig{.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 2, .d_model = 128, .dropout = 0.1};
  w.batch = 8;
  o.workload = w;
  o.techniques = "none,split=stages:2,split=attention-mlp,ckpt+split=stages:2,ckpt+bf16pure+split=stages:2,split=balanced";
  const Plan all = make_plan(o);
  // cpu:0 gets room for everything; cpu:1 a budget between the least and the most any split
  // puts there (checkpointing halves that device's activations).
  int64_t room0 = 0, lo1 = -1, hi1 = 0;
  for (const PlanRow& r : all.rows) {
    room0 = std::max(room0, r.devices.empty() ? r.memory.reserved : r.devices[0].memory.reserved);
    if (r.devices.empty()) continue;
    const int64_t p1 = r.devices[1].memory.peak;
    lo1 = lo1 < 0 ? p1 : std::min(lo1, p1), hi1 = std::max(hi1, p1);
  }
  INFO(all.table());
  REQUIRE(lo1 < hi1);
  const int64_t budget1 = (lo1 + hi1) / 2;
  REQUIRE(budget1 < all.rows[0].memory.peak);  // one value this small: the single-device row would not fit
  o.memory_limit = "cpu:0=" + std::to_string(2 * room0) + ",cpu:1=" + std::to_string(budget1);
  o.verify = true;
  const Plan some = make_plan(o);
  CHECK(some.per_device);
  CHECK(some.budget == 2 * room0);  // --device's: the single-device row's
  CHECK(some.budget_of(Device("cpu:1")) == budget1);
  CHECK(some.rows[0].fits);
  int split_fit = 0, splits = 0;
  for (const PlanRow& r : some.rows) {
    INFO(r.combination.name << "\n" << some.table());
    CHECK(r.fits == r.measured_fits);  // what the step does on cpu:0 and cpu:1 under their budgets
    if (r.devices.empty()) continue;
    ++splits;
    split_fit += r.fits;
    if (r.fits) CHECK(r.devices[1].memory.peak <= budget1);
    if (!r.fits) CHECK(r.devices[0].memory.peak < 2 * room0);  // the device over its budget is cpu:1
  }
  CHECK(split_fit > 0);
  CHECK(split_fit < splits);
  // balanced cuts against the budgets: most blocks on the roomy cpu:0, so it fits where stages:2 does not.
  const PlanRow& balanced = some.rows.back();
  INFO(some.table());
  CHECK(balanced.fits);
  CHECK_FALSE(some.rows[1].fits);
  CHECK(balanced.devices[1].memory.peak < all.rows[1].devices[1].memory.peak);
  const std::string table = some.table();
  CHECK(table.find("budget cpu:0 ") != std::string::npos);
  CHECK(table.find("; budget " + format_bytes(budget1)) != std::string::npos);
  const nlohmann::json j = some.to_json();
  CHECK(j[1]["devices"][1]["budget_bytes"] == budget1);
  CHECK(j[1]["devices"][0]["budget_bytes"] == 2 * room0);

  // Bad budgets name the problem.
  o.verify = false;
  o.memory_limit = "cpu:2=1MiB";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("--memory-limit: cpu:2 is not a device of this run"));
  o.memory_limit = "cpu:0=1MiB,cpu:0=2MiB";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("cpu:0 is given twice"));
  o.memory_limit = "cpu:0=0,cpu:1=1MiB";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("must be positive"));
  o.memory_limit = "cpu:0=1KiB,cpu:1=1KiB";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("below the parameters alone") &&
                                      Catch::Contains("cpu:0 1.00 KiB, cpu:1 1.00 KiB"));
  // cpu:1 alone too small: the single-device row on cpu:0 has no budget and still fits.
  o.memory_limit = "cpu:1=1KiB";
  const Plan one = make_plan(o);
  CHECK(one.budget == 0);
  CHECK(one.rows[0].fits);
  for (const PlanRow& r : one.rows)
    if (!r.devices.empty()) CHECK_FALSE(r.fits);
}

TEST_CASE("plan: split rows need --devices and refuse pipelines, offload and a wrong stage count", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.techniques = "split=stages:2";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("--devices"));
  o.devices = {Device("cpu:0"), Device("cpu:1")};
  o.techniques = "accum2+split=stages:2+pipeline=1f1b";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("pipelined splits are not planned"));
  o.techniques = "split=stages:2+offload";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("does not offload"));
  o.techniques = "split=stages:3";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("plan: 'split=stages:3': --split stages:3 needs 3 devices, got 2 (cpu:0,cpu:1)"));
  o.devices = {Device("cpu:0"), Device(DeviceType::cuda, 1)};
  o.techniques = "split=stages:2";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("--devices cuda:1: plans are for cpu:N"));
  o.devices = {Device("cpu:0"), Device("cpu:1")};
  o.techniques = "split=tensor";
  o.workload->gpt->n_head = 1;  // one head does not divide over 2 devices
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("cpu:0") && !Catch::Contains("meta:"));
}

TEST_CASE("plan --calibrate steps: the estimates and the ranking come from the measured pieces", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.techniques = "none,bf16,accum2,split=stages:2,ddp=2,zero1=2";
  o.devices = {Device("cpu:0"), Device("cpu:1")};
  o.calibrate = "steps";
  // Pieces that rank the rows unlike FLOPs do (accumulation cheapest): the plan must follow them,
  // n micro-steps x micro-step + update, and time nothing itself. A split row has a micro-step
  // piece of its own; a data-parallel row is one rank's: micro-steps of its half of the batch (the
  // same shape of work as accum2's micro-step), the update (half of it under ZeRO) and the collectives.
  const Combination none = parse_combination("none", 4, kCPU), bf16 = parse_combination("bf16", 4, kCPU),
                    accum2 = parse_combination("accum2", 4, kCPU),
                    split = parse_combination("split=stages:2", 4, kCPU, o.devices);
  StepPieces pieces;
  pieces.micro_ms[StepPieces::micro_key(*o.workload, none.techniques)] = 10.0;
  pieces.micro_ms[StepPieces::micro_key(*o.workload, bf16.techniques)] = 50.0;
  pieces.micro_ms[StepPieces::micro_key(*o.workload, accum2.techniques)] = 3.0;
  pieces.micro_ms[StepPieces::micro_key(*o.workload, split.techniques, split.parallel)] = 12.0;
  pieces.update_ms[StepPieces::update_key(*o.workload, Precision::fp32)] = 1.0;
  pieces.update_ms[StepPieces::update_key(*o.workload, Precision::bf16)] = 2.0;
  o.pieces = pieces;
  const Plan p = make_plan(o);
  REQUIRE(p.rows.size() == 6);
  CHECK(p.rows[0].estimated_ms == 11.0);
  CHECK(p.rows[1].estimated_ms == 52.0);
  CHECK(p.rows[2].estimated_ms == 2 * 3.0 + 1.0);
  CHECK(p.rows[3].estimated_ms == 12.0 + 1.0);
  CHECK(p.rows[4].comm_ms > 0);
  CHECK(p.rows[4].estimated_ms == Approx(3.0 + 1.0 + p.rows[4].comm_ms));
  CHECK(p.rows[5].estimated_ms == Approx(3.0 + 0.5 + p.rows[5].comm_ms));
  for (const PlanRow& r : p.rows) CHECK(r.from_steps);
  REQUIRE(p.recommended >= 0);
  for (const PlanRow& r : p.rows) CHECK(p.rows[size_t(p.recommended)].estimated_ms <= r.estimated_ms);
  REQUIRE(p.pieces.has_value());
  CHECK(p.pieces->timed_now == 0);
  CHECK(p.to_json()[2]["ms_per_step_from"] == "steps");
  CHECK(p.table().find("(est from: steps)") != std::string::npos);
  // A budget between accum2's peak and the plain step's: the row that fits keeps its pieces, the
  // one that does not (it cannot be recommended) keeps the FLOP estimate.
  REQUIRE(p.rows[2].memory.peak < p.rows[0].memory.peak);
  o.memory_limit = std::to_string((p.rows[2].memory.peak + p.rows[0].memory.peak) / 2);
  o.techniques = "none,accum2";
  o.devices.clear();
  const Plan q = make_plan(o);
  CHECK_FALSE(q.rows[0].fits);
  CHECK_FALSE(q.rows[0].from_steps);
  CHECK(q.rows[1].from_steps);
  CHECK(q.recommended == 1);
  o.calibrate = "guess";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("--calibrate must be flops or steps"));
}

TEST_CASE("plan --calibrate steps: missing pieces are timed, one per shape of work and precision", "[plan][apps]") {
  const PlanWorkload w = tiny_gpt();
  const std::vector<Device> two{Device("cpu:0"), Device("cpu:1")};
  const Combination split = parse_combination("accum2+split=stages:2", 4, kCPU, two);
  const std::vector<PieceShape> candidates{{.techniques = parse_combination("none", 4, kCPU).techniques},
                                           {.techniques = parse_combination("accum2", 4, kCPU).techniques},
                                           {.techniques = parse_combination("ckpt+accum2", 4, kCPU).techniques},
                                           {.techniques = split.techniques, .parallel = split.parallel}};
  StepPieces pieces;
  pieces.cpu_time = true;
  measure_step_pieces(w, candidates, kCPU, 1, pieces);
  CHECK(pieces.timed_now == 5);  // the fp32 update and four micro-step shapes (the split's its own)
  CHECK(pieces.micro_ms.size() == 4);
  CHECK(pieces.update_ms.size() == 1);
  for (const PieceShape& c : candidates) {
    const TechniqueOptions& t = c.techniques;
    const double micro = pieces.micro_ms.at(StepPieces::micro_key(w, t, c.parallel));
    const double update = pieces.update_ms.at(StepPieces::update_key(w, Precision::fp32));
    CHECK(micro > 0);
    CHECK(pieces.estimate_ms(w, t, c.parallel).value() == (t.micro_batch == 2 ? 2.0 : 1.0) * micro + update);
  }
  CHECK(StepPieces::micro_key(w, split.techniques, split.parallel) != StepPieces::micro_key(w, split.techniques));
  ModelParallelOptions against = split.parallel;
  against.balance_budgets = {1 << 30, 1 << 29};
  CHECK(StepPieces::micro_key(w, split.techniques, against) != StepPieces::micro_key(w, split.techniques, split.parallel));
  measure_step_pieces(w, candidates, kCPU, 1, pieces);  // nothing left to time
  CHECK(pieces.timed_now == 5);
}

TEST_CASE("plan: a budget below the parameters alone names the minimum and what lowers it", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.techniques = "none,bf16pure";
  o.memory_limit = "1KiB";
  try {
    make_plan(o);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("below the parameters alone") != std::string::npos);
    CHECK(m.find("the least any candidate needs is") != std::string::npos);
    CHECK(m.find("bf16pure") != std::string::npos);
  }
}

TEST_CASE("plan: adam8bit replaces AdamW's state, not SGD", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.optimizer = "sgd";
  o.techniques = "none,adam8bit";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("'adam8bit' stores AdamW's moments in 8 bits, but the run's optimizer is sgd"));
}

TEST_CASE("plan: unknown models, techniques and devices are clear errors", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.model = "gpt-huge";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("unknown model 'gpt-huge'") && Catch::Contains("gpt2-124m"));
  o.model = "gpt-mini";
  o.techniques = "ckpt+zip";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("unknown technique 'zip'"));
  o.techniques = "accum3";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("does not divide"));
  o.techniques = "";
  o.device = "cuda:0";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("plans are for cpu:N"));
  o.device = "cpu:0";
  o.memory_limit = "lots";
  CHECK_THROWS(make_plan(o));
}

TEST_CASE("plan: the default candidates cover every policy, precision and accumulation that divides the batch", "[plan][apps]") {
  const std::string d = default_candidates(8);
  for (const char* c : {"none,", "ckpt,", "ckpt-sqrt+bf16pure+accum4", "selective+bf16+accum4", "offload", "ckpt+offload"})
    CHECK(d.find(c) != std::string::npos);
  CHECK(split_candidates(PlanWorkload::named("gpt-mini"), 2).find("split=tensor") != std::string::npos);
  CHECK(split_candidates(PlanWorkload::named("gpt-mini"), 3).find("attention-mlp") == std::string::npos);
  CHECK(split_candidates(PlanWorkload::named("mobilenetv2-32"), 2) ==
        "split=balanced,ckpt+split=balanced,bf16+split=balanced");
  CHECK(default_candidates(6).find("accum4") == std::string::npos);
  CHECK(default_candidates(6).find("bf16+accum2") != std::string::npos);
  CHECK(parse_combinations(d, 8, kCPU).size() == 4 * 3 * 2 + 2);
}

TEST_CASE("plan: a cached calibration is reused only for the same CPU and thread count and GEMM paths", "[plan][apps]") {
  const auto dir = std::filesystem::temp_directory_path() / ("memgrad-test-calibration-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("MG_CACHE_DIR", dir.c_str(), 1);
  const Calibration first = Calibration::of_this_machine();
  CHECK_FALSE(first.cached);
  CHECK(first.gemm == cpu_gemm_backend());
  REQUIRE(first.path == calibration_cache_path());
  const Calibration again = Calibration::of_this_machine();
  CHECK(again.cached);
  CHECK(again.gflops[0] == first.gflops[0]);
  // A cache measured with another GEMM path (MG_GEMM_KERNEL, MG_BF16_DOT, MG_AMX) is measured anew.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(first.path));
  j["gemm"] = "another GEMM";
  std::ofstream(first.path) << j.dump();
  CHECK_FALSE(Calibration::of_this_machine().cached);
  CHECK(Calibration::of_this_machine().cached);  // rewritten with this path
  std::filesystem::remove_all(dir);
  use_test_cache();
}
