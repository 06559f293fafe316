// Split strategies: --split / --devices parsing and their errors, per-device peaks predicted on
// meta against the allocators of a real run (every category), balanced's cut on gpt-small, and
// a GPT that does not fit one device's budget training when split over two with the same budget.
#include <catch2/catch.hpp>

#include "optim/adam.h"
#include "parallel/split.h"
#include "parallel_test_util.h"

using namespace mg;

namespace {

// Two training steps of the probe's model placed on real devices, peaks of the second step.
std::vector<DevicePeak> measure_real(const StepProbe& probe, const Placement& placement, Device build_on) {
  const std::vector<Device> devices = placement.devices();
  for (const Device& d : devices) empty_cache(d);  // start from empty pools, as measure_on_meta does
  auto model = probe.build(build_on);
  const ResolvedPlacement r = apply_placement(*model, placement);
  auto opt = probe.optimizer(*model);
  for (int step = 0; step < 2; ++step) {
    if (step == 1)
      for (const Device& d : devices) reset_peak_stats(d);
    Tensor loss = probe.loss(*model);
    backward(loss);
    loss = Tensor();
    opt->step();
    opt->zero_grad();
  }
  std::vector<DevicePeak> peaks = device_peaks(devices);
  for (auto& p : peaks) p.modules = r.modules_on(p.device);
  return peaks;
}

int64_t largest(const std::vector<DevicePeak>& p) {
  int64_t m = 0;
  for (const auto& d : p) m = std::max(m, d.peak);
  return m;
}

}  // namespace

TEST_CASE("split: strategies and device lists parse, bad ones name the problem", "[parallel]") {
  CHECK(SplitSpec::parse("attention-mlp").kind == SplitSpec::Kind::attention_mlp);
  CHECK(SplitSpec::parse("stages:3").stages == 3);
  CHECK(SplitSpec::parse("stages:3").str() == "stages:3");
  CHECK(SplitSpec::parse("balanced").kind == SplitSpec::Kind::balanced);
  CHECK_THROWS_WITH(SplitSpec::parse("stages:0"), Catch::Contains("must be a positive integer"));
  CHECK(SplitSpec::parse("tensor").kind == SplitSpec::Kind::tensor);
  CHECK(SplitSpec::parse("tensor").str() == "tensor");
  CHECK_THROWS_WITH(SplitSpec::parse("tensor-ish"),
                    Catch::Contains("unknown strategy (known: attention-mlp, stages:K, balanced, tensor)"));
  CHECK(parse_devices("cpu:0,cpu:1") == std::vector<Device>{Device("cpu:0"), Device("cpu:1")});
  CHECK_THROWS_WITH(parse_devices("cpu:0,cpu:0"), Catch::Contains("device cpu:0 is listed twice"));
  CHECK_THROWS_WITH(parse_devices("cpu:0,"), Catch::Contains("empty device name"));

  auto gpt = test::tiny_gpt(kMeta);
  const std::vector<Device> two{Device("cpu:0"), Device("cpu:1")};
  CHECK_THROWS_WITH(split_placement(SplitSpec::parse("stages:3"), *gpt, two), Catch::Contains("needs 3 devices, got 2"));
  CHECK_THROWS_WITH(split_placement(SplitSpec::parse("attention-mlp"), *gpt, {Device("cpu:0")}),
                    Catch::Contains("needs exactly 2 devices"));
  CHECK_THROWS_WITH(split_placement(SplitSpec::parse("balanced"), *gpt, two), Catch::Contains("no training step to measure"));
  std::vector<Device> five;
  for (int i = 0; i < 5; ++i) five.emplace_back(DeviceType::cpu, i);
  CHECK_THROWS_WITH(split_placement(SplitSpec::parse("stages:5"), *gpt, five), Catch::Contains("has only 4 blocks"));
  const MobileNetV2Config mcfg{.width_mult = 0.25, .num_classes = 5, .small_input = true, .input_size = 16};
  MobileNetV2 net(mcfg, {.device = kMeta});
  CHECK_THROWS_WITH(split_placement(SplitSpec::parse("attention-mlp"), net, two),
                    Catch::Contains("only a GPT has attention and feed-forward sublayers"));
  CHECK(split_placement(SplitSpec::parse("stages:2"), *gpt, two).str() == "wte,wpe,h.0-1=cpu:0;h.2-3,ln_f=cpu:1");
}

TEST_CASE("split: the peaks predicted on meta are the peaks each device's allocator measures", "[parallel]") {
  const StepProbe probe = gpt_step_probe(test::tiny_gpt_config(0.1), 2, 12);
  const Device a("cpu:6"), b("cpu:7");
  for (const char* split : {"attention-mlp", "stages:2"}) {
    INFO(split);
    auto shape_model = probe.build(kMeta);
    const Placement p = split_placement(SplitSpec::parse(split), *shape_model, {a, b});
    const std::vector<DevicePeak> predicted = measure_on_meta(probe, p);
    const std::vector<DevicePeak> measured = measure_real(probe, p, a);
    INFO(device_peaks_table(measured, predicted));
    REQUIRE(predicted.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(predicted[i].device == measured[i].device);
      CHECK(predicted[i].modules == measured[i].modules);
      // Meta runs no kernels, so the scratch a CPU kernel takes inside (workspace) is the only
      // difference: every other category is exact, the peak within the workspace's.
      const int64_t workspace = measured[i].of(MemoryCategory::workspace);
      CHECK(predicted[i].peak <= measured[i].peak);
      CHECK(measured[i].peak <= predicted[i].peak + workspace);
      for (MemoryCategory c : kAllMemoryCategories) {
        INFO(category_name(c));
        if (c != MemoryCategory::workspace) CHECK(predicted[i].of(c) == measured[i].of(c));
      }
      CHECK(measured[i].of(MemoryCategory::parameter) > 0);
      CHECK(measured[i].of(MemoryCategory::optimizer_state) == 2 * measured[i].of(MemoryCategory::parameter));
      CHECK(measured[i].of(MemoryCategory::activation) > 0);
    }
  }
}

TEST_CASE("split: balanced over two devices halves gpt-small's peak (on meta)", "[parallel]") {
  const StepProbe probe = gpt_step_probe(GPTConfig::named("gpt-small"), 8, 256);
  const std::vector<Device> devices{Device("cpu:0"), Device("cpu:1")};
  auto model = probe.build(kMeta);
  const int64_t single = measure_on_meta(probe, Placement::parse("wte,wpe,h,ln_f=cpu:0")).front().peak;
  BalancedPlan plan;
  const Placement p = split_placement(SplitSpec::parse("balanced"), *model, devices, &probe, &plan);
  INFO(plan.str());
  CHECK(p.str() == plan.placement.str());
  CHECK(plan.counts.size() == 2);
  CHECK(plan.counts[0] + plan.counts[1] == 8);
  const int64_t equal = largest(measure_on_meta(probe, stages_placement(model_layout(*model), devices, {4, 4})));
  CHECK(largest(plan.predicted) <= equal);
  CHECK(double(largest(plan.predicted)) <= 0.6 * double(single));
  // The parameters of the two halves add up to the model's (f32, sizes multiples of 512 B).
  int64_t bytes = 0;
  for (const auto& [_, t] : model->named_parameters()) bytes += t.numel() * 4;
  CHECK(plan.predicted[0].of(MemoryCategory::parameter) + plan.predicted[1].of(MemoryCategory::parameter) == bytes);
}

TEST_CASE("split: balanced against per-device budgets gives the larger device more blocks (on meta)", "[parallel]") {
  const StepProbe probe = gpt_step_probe(GPTConfig::named("gpt-small"), 8, 256);
  const std::vector<Device> devices{Device("cpu:0"), Device("cpu:1")};
  const int64_t big = int64_t(600) << 20, small = int64_t(300) << 20;
  const BalancedPlan equal = plan_balanced(probe, devices);
  const BalancedPlan weighted = plan_balanced(probe, devices, {big, small});
  INFO(equal.str() << weighted.str());
  CHECK(weighted.counts[0] > equal.counts[0]);
  CHECK(weighted.predicted[0].peak > weighted.predicted[1].peak);
  // The fuller device, as a fraction of its budget, is less full than under the equal cut.
  auto load = [&](const BalancedPlan& p) {
    return std::max(double(p.predicted[0].peak) / double(big), double(p.predicted[1].peak) / double(small));
  };
  CHECK(load(weighted) < load(equal));
  CHECK(weighted.str().find("% of 300.00 MiB") != std::string::npos);
  CHECK_THROWS_WITH(plan_balanced(probe, devices, {big}), Catch::Contains("1 budgets for 2 devices"));
  CHECK_THROWS_WITH(plan_balanced(probe, devices, {big, 0}), Catch::Contains("must be positive"));
}

TEST_CASE("split: a GPT over its budget on one device trains on two with the same budget", "[parallel]") {
  const StepProbe probe = gpt_step_probe(test::tiny_gpt_config(0.0), 4, 16);
  const Device a("cpu:8"), b("cpu:9");
  const int64_t single = measure_on_meta(probe, Placement::parse("wte,wpe,h,ln_f=cpu:8")).front().peak;
  BalancedPlan plan = plan_balanced(probe, {a, b});
  const size_t budget = size_t(double(single) * 0.8);
  INFO("single-device peak " << format_bytes(single) << ", budget " << format_bytes(int64_t(budget)) << "\n" << plan.str());
  REQUIRE(largest(plan.predicted) < int64_t(budget));
  struct Limits {  // the budgets go away even when a check fails
    Device a, b;
    ~Limits() {
      set_memory_limit(a, 0);
      set_memory_limit(b, 0);
    }
  } limits{a, b};
  set_memory_limit(a, budget);
  set_memory_limit(b, budget);
  {
    auto model = probe.build(a);
    auto opt = probe.optimizer(*model);
    auto train = [&] {
      for (int step = 0; step < 2; ++step) {
        Tensor loss = probe.loss(*model);
        backward(loss);
        loss = Tensor();
        opt->step();
        opt->zero_grad();
      }
    };
    CHECK_THROWS_AS(train(), OutOfMemoryError);
  }
  auto model = probe.build(a);
  apply_placement(*model, plan.placement);
  auto opt = probe.optimizer(*model);
  reset_peak_stats(a);
  reset_peak_stats(b);
  for (int step = 0; step < 3; ++step) {
    Tensor loss = probe.loss(*model);
    CHECK(std::isfinite(loss.item<double>()));
    backward(loss);
    loss = Tensor();
    opt->step();
    opt->zero_grad();
  }
  CHECK(memory_stats(a).allocated.peak <= int64_t(budget));
  CHECK(memory_stats(b).allocated.peak <= int64_t(budget));

  // Too small a budget for the split too: the error names the device and what lives there.
  empty_cache(b);
  set_memory_limit(b, size_t(memory_stats(b).reserved.current) + 1024);
  std::string message;
  try {
    const ResolvedPlacement r = resolve_placement(*model, plan.placement);
    try {
      Tensor loss = probe.loss(*model);
      backward(loss);
    } catch (const OutOfMemoryError& e) {
      throw with_placement(e, r);
    }
  } catch (const OutOfMemoryError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("out of memory on cpu:9"));
  CHECK_THAT(message, Catch::Contains("model split over devices: cpu:8 holds wte,wpe,h.0-"));
  CHECK_THAT(message, Catch::Contains("; cpu:9 holds h."));
}

TEST_CASE("split: meta:N are separate meta pools", "[parallel]") {
  CHECK(Device("meta").str() == "meta");
  CHECK(Device("meta:3").str() == "meta:3");
  CHECK(Device("meta:0") == kMeta);
  const Device m3("meta:3"), m4("meta:4");
  const int64_t before3 = memory_stats(m3).allocated.current, before4 = memory_stats(m4).allocated.current;
  Tensor x = zeros({1024}, {.device = m3});
  Tensor y = to(x, m4);  // a move between metas allocates on the target only, no data
  CHECK(y.device() == m4);
  CHECK(memory_stats(m3).allocated.current - before3 == 4096);
  CHECK(memory_stats(m4).allocated.current - before4 == 4096);
  CHECK_THROWS_WITH(add(x, y), Catch::Contains("meta:3 and meta:4"));
}
