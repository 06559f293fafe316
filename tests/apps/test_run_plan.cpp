// --plan auto and --auto-fit through the planner, on tiny models on cpu:0: under a budget where
// the plain run runs out of memory, the planned run trains at the predicted peak (up to the
// loader's prefetched batches) and a
// resumed run keeps its plan; an --auto-fit run whose first plan runs out of memory switches to the
// planner's next one and sees the same samples (its losses equal a run that used that plan from
// the start), on one device and on a split model (the placement kept, each device under its own
// budget); bad combinations and budgets too small for any plan get clear errors.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/gpt_train.h"
#include "apps/plan.h"
#include "apps/run_plan.h"
#include "apps/vision_train.h"
#include "core/allocator.h"

using namespace mg;
using namespace mg::test;

namespace {

void use_test_cache() {  // one calibration for every test process, never in the user's home
  const auto dir = std::filesystem::temp_directory_path() / "memgrad-test-cache";
  ::setenv("MG_CACHE_DIR", dir.c_str(), 1);
}

GptTrainOptions tiny_gpt(const std::string& data, const std::string& out) {
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.1};
  o.data = data;
  o.out = out;
  o.steps = 3;
  o.batch = 4;
  o.warmup = 1;
  o.eval_every = 100;
  o.eval_windows = 4;
  o.checkpoint_every = 2;
  o.progress = ProgressStyle::none;
  return o;
}

// A GPT over cpu:0 and cpu:1, large enough that per-device budgets pass the allocator's first 2
// MiB segments.
GptTrainOptions split_gpt(const std::string& data, const std::string& out) {
  GptTrainOptions o = tiny_gpt(data, out);
  o.model = GPTConfig{.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 2, .d_model = 128, .dropout = 0.1};
  o.batch = 8;
  o.parallel.devices = {Device("cpu:0"), Device("cpu:1")};
  return o;
}

// A budget between the plain step's peak and the smallest candidate's: plain fails, some plan fits.
int64_t squeezed_budget(const PlanWorkload& w) {
  PlanOptions po;
  po.workload = w;
  po.optimizer = optimizer_kind_name(w.optimizer);
  const Plan all = make_plan(po);
  int64_t none = 0, least = INT64_MAX;
  for (const PlanRow& r : all.rows) {
    if (r.combination.name == "none") none = r.memory.peak;
    least = std::min(least, r.memory.peak);
  }
  REQUIRE(least < none);
  return (none + least) / 2;
}

// The plan counts the loader's two prefetched batches as live for the whole step; its thread may
// not have allocated them yet at the step's peak (docs/PLAN.md, "Not yet"), so a run's peak equals
// the plan's or falls short of it by at most those two batches.
void check_peak(int64_t measured, int64_t predicted, int64_t batch_bytes) {
  CHECK(measured <= predicted);
  CHECK(measured >= predicted - 2 * batch_bytes);
}

// Every budget this process set, put back to none (tests share the process).
struct NoLimits {
  ~NoLimits() { set_memory_limit(kCPU, 0); }
};
// The budgets a split run over cpu:0 and cpu:1 set, put back to none.
struct NoSplitLimits {
  ~NoSplitLimits() {
    set_memory_limit(Device("cpu:0"), 0);
    set_memory_limit(Device("cpu:1"), 0);
  }
};

}  // namespace

TEST_CASE("gpt train --plan auto: trains where the plain run cannot, at the predicted peak, and resumes with its plan", "[plan][apps]") {
  use_test_cache();
  NoLimits no_limits;
  DataTempDir tmp("run_plan");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions o = tiny_gpt(data, tmp.file("plain"));
  const int64_t budget = squeezed_budget(run_workload(o, "custom", o.model, std::nullopt));
  o.memory_limit = std::to_string(budget);
  CHECK_THROWS_AS(gpt_train(o), OutOfMemoryError);

  o.out = tmp.file("planned");
  o.plan = "auto";
  o.stop_after = 2;
  const GptTrainResult first = gpt_train(o);
  const nlohmann::json config = RunDir(first.run_dir).read_config();
  REQUIRE(config.contains("plan"));
  const nlohmann::json& plan = config["plan"];
  INFO(plan.dump());
  CHECK(plan.at("combination") != "none");
  CHECK(plan.at("budget_bytes") == budget);
  CHECK(plan.at("predicted_peak_bytes").get<int64_t>() <= budget);
  const int64_t batch_bytes = 2 * o.batch * o.model->context * 8;  // (B, T) i64 tokens and targets
  check_peak(first.memory.peak, plan.at("predicted_peak_bytes").get<int64_t>(), batch_bytes);
  // The plan's techniques are the run's: config.json holds them, so --resume trains with them.
  const TechniqueOptions chosen = TechniqueOptions{}.from_config(config);
  CHECK(chosen.str() != "none");
  GptTrainOptions resume;
  resume.resume = first.run_dir;
  resume.memory_limit = o.memory_limit;
  resume.progress = ProgressStyle::none;
  const GptTrainResult rest = gpt_train(resume);
  CHECK(rest.steps_done == 3);
  check_peak(rest.memory.peak, plan.at("predicted_peak_bytes").get<int64_t>(), batch_bytes);
  CHECK(rest.micro_batch == chosen.micro_batch);
}

TEST_CASE("gpt train --plan with --devices: splits the model where one device cannot hold it, at the planned peaks", "[plan][apps]") {
  use_test_cache();
  NoSplitLimits no_limits;
  DataTempDir tmp("run_plan_split");
  const std::string data = write_tiny_token_file(tmp, 20000);
  GptTrainOptions o = split_gpt(data, tmp.file("split"));
  o.stop_after = 2;
  o.plan = "none,ckpt,split=stages:2,ckpt+split=balanced";
  // Each device's budget halfway between the checkpointed split's fullest device and ckpt on one
  // device: only a split can fit (the plan run on meta says which, before the run).
  PlanOptions po;
  po.workload = run_workload(o, "custom", o.model, std::nullopt);
  po.techniques = o.plan;
  po.devices = o.parallel.devices;
  const Plan all = make_plan(po);
  REQUIRE(all.rows.size() == 4);
  const int64_t one_device = std::min(all.rows[0].memory.peak, all.rows[1].memory.peak);
  const int64_t split_peak = all.rows[3].memory.peak;
  REQUIRE(split_peak < one_device);
  const int64_t budget = (split_peak + one_device) / 2;
  o.memory_limit = "cpu:0=" + std::to_string(budget) + ",cpu:1=" + std::to_string(budget);
  po.memory_limit = o.memory_limit;
  const Plan planned = make_plan(po);
  INFO(planned.table());
  REQUIRE(planned.recommended >= 0);
  const PlanRow& row = planned.rows[size_t(planned.recommended)];
  REQUIRE(row.combination.parallel.active());

  const GptTrainResult r = gpt_train(o);
  const nlohmann::json config = RunDir(r.run_dir).read_config();
  INFO(config.dump());
  CHECK(config.at("plan").at("combination") == row.combination.name);
  CHECK(config.at("plan").at("budgets") == planned.budget_str());
  CHECK(config.at("model_parallel").at("devices") == nlohmann::json({"cpu:0", "cpu:1"}));
  CHECK(config.at("model_parallel").contains("split"));
  // Every device at the planned peak (the input device up to the loader's prefetched batches).
  REQUIRE(r.device_peaks.size() == 2);
  const int64_t batch_bytes = 2 * o.batch * o.model->context * 8;
  for (size_t k = 0; k < 2; ++k) {
    INFO(r.device_peaks[k].device.str());
    CHECK(r.device_peaks[k].device == row.devices[k].device);
    CHECK(r.device_peaks[k].peak <= budget);
    check_peak(r.device_peaks[k].peak, row.devices[k].memory.peak, k == 0 ? batch_bytes : 0);
  }

  // A plan on one device drops the other device's budget; a split given by hand is refused.
  GptTrainOptions single = tiny_gpt(data, tmp.file("single"));
  single.plan = "none,ckpt";
  single.parallel.devices = {Device("cpu:0"), Device("cpu:1")};
  single.memory_limit = "cpu:0=1GiB,cpu:1=1KiB";
  single.stop_after = 1;
  const nlohmann::json single_config = RunDir(gpt_train(single).run_dir).read_config();
  CHECK(single_config.at("model_parallel").is_null());
  single.parallel.split = SplitSpec::parse("balanced");
  CHECK_THROWS_WITH(gpt_train(single), Catch::Contains("--plan chooses the split itself"));
  single.parallel.split.reset();
  single.parallel.devices = {Device("cpu:1")};
  CHECK_THROWS_WITH(gpt_train(single), Catch::Contains("needs at least two devices"));
}

TEST_CASE("gpt train --plan auto --plan-calibrate steps: the plan's time comes from timed micro-steps", "[plan][apps]") {
  use_test_cache();
  NoLimits no_limits;
  DataTempDir tmp("run_plan_steps");
  GptTrainOptions o = tiny_gpt(write_tiny_token_file(tmp), tmp.file("planned"));
  // A budget every candidate fits: this case is about the time estimate, not the fit.
  o.memory_limit = "64MiB";
  o.plan = "auto";
  o.plan_calibrate = "steps";
  o.stop_after = 1;
  const nlohmann::json plan = RunDir(gpt_train(o).run_dir).read_config().at("plan");
  INFO(plan.dump());
  CHECK(plan.at("predicted_ms_from") == "steps");
  CHECK(plan.at("predicted_ms_per_step").get<double>() > 0.0);
  CHECK(plan.at("summary").get<std::string>().find("from timed micro-steps") != std::string::npos);
  o.out = tmp.file("flops");
  o.plan_calibrate = "flops";
  CHECK(RunDir(gpt_train(o).run_dir).read_config().at("plan").at("predicted_ms_from") == "flops");
  o.out = tmp.file("bad");
  o.plan_calibrate = "guess";
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("--plan-calibrate must be flops or steps, got 'guess'"));
}

TEST_CASE("vision train --plan auto: the plan's peak is the run's", "[plan][apps]") {
  use_test_cache();
  NoLimits no_limits;
  DataTempDir tmp("run_plan");
  VisionTrainOptions o;
  o.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .input_size = 8};
  o.data = write_tiny_image_folder(tmp, 12);
  o.out = tmp.file("run");
  o.batch = 8;
  o.stop_after = 2;
  o.progress = ProgressStyle::none;
  const int64_t budget = squeezed_budget(run_workload(o, "custom", std::nullopt, o.config));
  o.memory_limit = std::to_string(budget);
  o.plan = "auto";
  const VisionTrainResult r = vision_train(o);
  const nlohmann::json plan = RunDir(r.run_dir).read_config().at("plan");
  INFO(plan.dump());
  CHECK(plan.at("combination") != "none");
  check_peak(r.memory.peak, plan.at("predicted_peak_bytes").get<int64_t>(), o.batch * (3 * 8 * 8 * 4 + 8));
}

TEST_CASE("auto-fit with the planner: the first plan runs out of memory, the run switches and sees the same samples", "[plan][apps]") {
  use_test_cache();
  NoLimits no_limits;
  DataTempDir tmp("run_plan");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions o = tiny_gpt(data, tmp.file("fit"));
  o.memory_limit = std::to_string(squeezed_budget(run_workload(o, "custom", o.model, std::nullopt)));
  o.techniques.auto_fit = true;
  const GptTrainResult fit = gpt_train(o);
  CHECK(fit.steps_done == 3);
  // The checkpoint records what auto-fit switched to (a resumed run restores it).
  const nlohmann::json trainer = RunDir(fit.run_dir).read_checkpoint_state().trainer;
  REQUIRE(trainer.contains("techniques"));
  const TechniqueOptions switched = TechniqueOptions{}.from_config({{"techniques", trainer["techniques"]}});
  INFO(switched.str());
  CHECK(switched.str() != "none");
  // The failed attempt was undone and the batch retried: the same losses as a run on that plan
  // from the start, without a budget.
  GptTrainOptions same = tiny_gpt(data, tmp.file("same"));
  same.techniques = switched;
  const GptTrainResult ref = gpt_train(same);
  CHECK(metrics_column(fit.run_dir, "loss") == metrics_column(ref.run_dir, "loss"));
}

TEST_CASE("auto-fit on a split model: the first plan runs out of memory on a device, the run switches techniques over the same placement", "[plan][apps]") {
  use_test_cache();
  NoSplitLimits no_limits;
  DataTempDir tmp("run_plan_split_fit");
  const std::string data = write_tiny_token_file(tmp, 20000);
  GptTrainOptions o = split_gpt(data, tmp.file("fit"));
  o.parallel.split = SplitSpec::parse("balanced");
  // Each device's budget halfway between the plain split's peak there and the checkpointed,
  // accumulated one's: the run's first step runs out of memory.
  PlanOptions po;
  po.workload = run_workload(o, "custom", o.model, std::nullopt);
  po.techniques = "split=balanced,ckpt+accum4+split=balanced";
  po.devices = o.parallel.devices;
  const Plan all = make_plan(po);
  REQUIRE(all.rows.size() == 2);
  std::vector<int64_t> budgets;
  for (size_t k = 0; k < 2; ++k) {
    const int64_t plain = all.rows[0].devices[k].memory.peak, least = all.rows[1].devices[k].memory.peak;
    REQUIRE(least < plain);
    budgets.push_back((plain + least) / 2);
  }
  o.memory_limit = "cpu:0=" + std::to_string(budgets[0]) + ",cpu:1=" + std::to_string(budgets[1]);
  o.techniques.auto_fit = true;
  const GptTrainResult fit = gpt_train(o);
  CHECK(fit.steps_done == 3);
  REQUIRE(fit.device_peaks.size() == 2);
  for (size_t k = 0; k < 2; ++k) CHECK(fit.device_peaks[k].peak <= budgets[k]);
  const nlohmann::json trainer = RunDir(fit.run_dir).read_checkpoint_state().trainer;
  REQUIRE(trainer.contains("techniques"));
  const TechniqueOptions switched = TechniqueOptions{}.from_config({{"techniques", trainer["techniques"]}});
  INFO(switched.str());
  CHECK(switched.str() != "none");
  CHECK_FALSE(switched.offload_activations.has_value());
  // The samples are those of a run on the switched plan from the start, without budgets (its
  // balanced cut, 2 + 2 blocks, is the one the failed plan's run kept).
  GptTrainOptions same = split_gpt(data, tmp.file("same"));
  same.parallel.split = o.parallel.split;
  same.techniques = switched;
  const GptTrainResult ref = gpt_train(same);
  CHECK(metrics_column(fit.run_dir, "loss") == metrics_column(ref.run_dir, "loss"));
}

TEST_CASE("plan auto: bad combinations and budgets too small for any plan are clear errors", "[plan][apps]") {
  use_test_cache();
  NoLimits no_limits;
  DataTempDir tmp("run_plan");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions o = tiny_gpt(data, tmp.file("a"));
  o.plan = "auto";
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("needs --memory-limit"));
  o.memory_limit = "64MiB";
  o.techniques.checkpoint = CheckpointPolicy::parse("blocks");
  o.out = tmp.file("b");
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("does not combine with --checkpoint"));
  o.techniques = {};
  o.out = tmp.file("c");
  o.memory_limit = "4KiB";  // below the parameters
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("below the parameters alone") && Catch::Contains("the least any candidate needs") &&
                                      Catch::Contains("hint: bf16pure"));
  o.out = tmp.file("d");
  o.memory_limit = "600KiB";  // above the parameters, below every candidate
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("nothing fits") && Catch::Contains("the least a candidate needs is") &&
                                      Catch::Contains("hint:"));
  o.out = tmp.file("e");
  o.memory_limit = "64MiB";
  o.plan = "ckpt+zip";
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("unknown technique 'zip'"));
  CHECK_THROWS_WITH(run_cli({"gpt", "train", "--resume", tmp.file("a"), "--plan", "auto"}), Catch::Contains("--plan"));
}
