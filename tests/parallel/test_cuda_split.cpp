// Model parallelism over cuda:N and over a mix of cuda:N and cpu:N (the part of a model that
// does not fit the card stays on the host). The planning side runs everywhere: the planner
// measures on meta, whatever kind the devices are. The GPU cases ([cuda_split], run by
// scripts/gpu-check) skip visibly without a GPU or without MG_TEST_DEVICE=cuda; they compare a
// split step (plain or pipelined by workers) with a single-device step within 1e-5, because
// cuBLAS and Eigen sum in different orders. Note [Streams and threads] (core/cuda/context.cpp)
// is what they exercise: two worker threads on one GPU, and event-ordered copies between GPUs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/cuda/backend.h"
#include "optim/adam.h"
#include "parallel/pipeline.h"
#include "parallel/split.h"
#include "parallel_test_util.h"
#include "cuda_skip.h"

using namespace mg;
using Catch::Matchers::Contains;

namespace {


const Device kGPU("cuda:0");

// Loss and every gradient within rel * (largest |value| of that tensor) + abs.
void check_close(const test::StepResult& got, const test::StepResult& want, double rel = 1e-5, double abs = 1e-7) {
  CHECK(std::abs(got.loss - want.loss) <= rel * std::abs(want.loss) + abs);
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [n, w] : want.grads) {
    INFO("gradient of " << n);
    REQUIRE(got.grads.count(n));
    const auto& g = got.grads.at(n);
    REQUIRE(g.size() == w.size());
    double scale = 0, diff = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      scale = std::max(scale, std::abs(w[i]));
      diff = std::max(diff, std::abs(g[i] - w[i]));
    }
    INFO("largest difference " << diff << " of largest gradient " << scale);
    CHECK(scale > 0);  // a gradient of zeros would compare equal to anything
    CHECK(diff <= rel * scale + abs);
  }
}

// The reference of a pipelined batch: its micro-batches one after another, each from its own
// random stream and weighted by its rows (what run_pipeline computes).
double micro_batched(GPT& gpt, const Tensor& idx, const Tensor& tgt, int64_t micro) {
  const int64_t B = idx.size(0), M = num_micro_batches(B, micro);
  const uint64_t base = default_generator().offset();
  double loss = 0;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t rows = std::min(micro, B - m * micro);
    default_generator().set_offset(micro_batch_stream(base, m));
    Tensor l = gpt.loss(narrow(idx, 0, m * micro, rows), narrow(tgt, 0, m * micro, rows));
    const double w = double(rows) / double(B);
    loss += to(l.detach(), kCPU).item<double>() * w;
    backward(mul(l, w));
  }
  default_generator().set_offset(micro_batch_stream(base, M));
  return loss;
}

// A GPT placed in stages over `devices` (counts[i] blocks on devices[i]), one pipelined batch of
// 5 rows in micro-batches of 2, run by a worker per stage.
test::StepResult pipelined(const std::vector<Device>& devices, const std::vector<int64_t>& counts, PipelineKind kind,
                           double dropout) {
  auto gpt = test::tiny_gpt(kCPU, dropout);
  apply_placement(*gpt, stages_placement(model_layout(*gpt), devices, counts));
  const Device in = gpt->wte->weight.device();
  const int64_t B = 5, T = 12, micro = 2;  // 3 micro-batches, the last one smaller
  const Tensor idx = test::random_tokens(B, T, 40, 21, in), tgt = test::random_tokens(B, T, 40, 22, in);
  manual_seed(5);
  const double loss = run_pipeline(make_schedule(kind, int64_t(counts.size()), num_micro_batches(B, micro)),
                                   gpt_pipeline_stages(*gpt, counts, idx, tgt, micro), B, micro);
  return test::collect(*gpt, scalar_tensor(loss));
}

}  // namespace

TEST_CASE("cuda split: a cpu + cuda device list is planned on meta, even without a GPU", "[parallel]") {
  const std::vector<Device> mixed = parse_devices("cuda:0,cpu:0");
  REQUIRE(mixed == std::vector<Device>{kGPU, kCPU});
  // The planner measures on meta:1..K whatever the devices are, and labels the peaks with them.
  const StepProbe probe = gpt_step_probe(test::tiny_gpt_config(0.0), 2, 12);
  const BalancedPlan plan = plan_balanced(probe, mixed);
  REQUIRE(plan.counts.size() == 2);
  CHECK(plan.counts[0] + plan.counts[1] == 4);
  CHECK(plan.counts[0] >= 1);
  CHECK(plan.counts[1] >= 1);
  REQUIRE(plan.predicted.size() == 2);
  CHECK(plan.predicted[0].device == kGPU);
  CHECK(plan.predicted[1].device == kCPU);
  CHECK(plan.predicted[0].peak > 0);
  CHECK(plan.predicted[1].peak > 0);
  auto device_of = [&](const std::string& path) {
    for (const auto& [p, d] : plan.placement.entries)
      if (p == path) return d;
    FAIL("no " << path << " in " << plan.placement.str());
    return kMeta;
  };
  CHECK(device_of("wte") == kGPU);   // the embeddings (and the tied head) go with the first stage
  CHECK(device_of("ln_f") == kCPU);  // the last LayerNorm and the loss with the last
  // The same plan on two host devices: the kind of device does not enter the measurement.
  const BalancedPlan host = plan_balanced(probe, {Device("cpu:1"), Device("cpu:2")});
  CHECK(host.counts == plan.counts);
  CHECK(host.predicted[0].peak == plan.predicted[0].peak);
  CHECK(host.predicted[1].peak == plan.predicted[1].peak);
}

TEST_CASE("cuda split: a GPU that is not there is one error before any planning", "[parallel]") {
  const int n = cuda::device_count();
  const Device missing(DeviceType::cuda, n);  // one past the last GPU (cuda:0 on this machine when it has none)
  auto gpt = test::tiny_gpt(kCPU, 0.0);
  const StepProbe probe = gpt_step_probe(test::tiny_gpt_config(0.0), 2, 12);
  for (const char* split : {"balanced", "stages:2"}) {
    INFO(split);
    CHECK_THROWS_WITH(split_placement(SplitSpec::parse(split), *gpt, {kCPU, missing}, &probe),
                      Contains("device " + missing.str()) && Contains("does not exist"));
  }
  // Nothing moved: the model is still on the host.
  for (const Tensor& p : gpt->parameters()) CHECK(p.device() == kCPU);
}

TEST_CASE("cuda split: GPT over cuda:0 + cpu:0 gives the single-device loss and gradients", "[parallel][cuda_split]") {
  MG_REQUIRE_CUDA();
  auto ref = test::tiny_gpt(kCPU, 0.0);  // dropout off: a GPU and the host draw masks by different kernels
  const test::StepResult want = test::gpt_step(*ref);
  for (const std::vector<Device>& devices : {std::vector<Device>{kGPU, kCPU}, std::vector<Device>{kCPU, kGPU}}) {
    INFO("blocks 0-1 on " << devices[0].str() << ", 2-3 on " << devices[1].str());
    auto gpt = test::tiny_gpt(kCPU, 0.0);
    apply_placement(*gpt, stages_placement(model_layout(*gpt), devices, {2, 2}));
    CHECK(gpt->h->at<Block>(0)->attn->c_attn->weight.device() == devices[0]);
    CHECK(gpt->h->at<Block>(3)->mlp->c_fc->weight.device() == devices[1]);
    check_close(test::gpt_step(*gpt), want);  // collect() checks each gradient is on its parameter's device
  }
  // attention on the GPU, feed-forward on the host, in every block: four crossings per block.
  auto gpt = test::tiny_gpt(kCPU, 0.0);
  apply_placement(*gpt, attention_mlp_placement(model_layout(*gpt), {kGPU, kCPU}));
  check_close(test::gpt_step(*gpt), want);
}

TEST_CASE("cuda split: the optimizer steps each device's parameters on that device", "[parallel][cuda_split]") {
  MG_REQUIRE_CUDA();
  auto run = [](const std::vector<Device>& devices) {
    auto gpt = test::tiny_gpt(kCPU, 0.0);
    if (devices.size() > 1) apply_placement(*gpt, stages_placement(model_layout(*gpt), devices, {2, 2}));
    // AdamW with a large eps: with the default 1e-8, a gradient near 0 makes the update
    // g / (|g| + eps) jump with the last bits of g, which the host and the GPU sum differently.
    auto opt = std::make_unique<AdamW>(gpt->named_parameters(), 3e-4, 0.01, AdamOptions{.eps = 1e-3});
    for (int step = 0; step < 2; ++step) {
      test::gpt_step(*gpt, 11 + uint64_t(step));
      opt->step();
      opt->zero_grad();
    }
    std::map<std::string, std::vector<double>> params;
    for (const auto& [n, p] : gpt->named_parameters()) params[n] = to(p.detach(), kCPU).to_double_vector();
    return params;
  };
  const auto want = run({kCPU});
  const auto got = run({kGPU, kCPU});
  for (const auto& [n, w] : want) {
    INFO(n);
    const auto& g = got.at(n);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      diff = std::max(diff, std::abs(g[i] - w[i]));
      scale = std::max(scale, std::abs(w[i]));
    }
    CHECK(diff <= 1e-5 * scale + 1e-7);
  }
}

TEST_CASE("cuda split: a pipeline with a worker per stage on the GPU equals the unpipelined step",
          "[parallel][cuda_split]") {
  MG_REQUIRE_CUDA();
  for (auto kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
    // Both stages on cuda:0: two worker threads share its stream (Note [Streams and threads]) and
    // each has its own cuBLAS handle. Dropout on: the masks come from the micro-batch streams.
    SECTION(pipeline_name(kind) + ": two stages on cuda:0") {
      auto ref = test::tiny_gpt(kGPU, 0.1);
      const int64_t B = 5, T = 12, micro = 2;
      const Tensor idx = test::random_tokens(B, T, 40, 21, kGPU), tgt = test::random_tokens(B, T, 40, 22, kGPU);
      manual_seed(5);
      const double loss = micro_batched(*ref, idx, tgt, micro);
      const test::StepResult want = test::collect(*ref, scalar_tensor(loss));
      for (int repeat = 0; repeat < 3; ++repeat) {  // the workers' timing differs run to run
        auto gpt = test::tiny_gpt(kGPU, 0.1);
        manual_seed(5);
        const double got_loss = run_pipeline(make_schedule(kind, 2, num_micro_batches(B, micro)),
                                             gpt_pipeline_stages(*gpt, {2, 2}, idx, tgt, micro), B, micro);
        check_close(test::collect(*gpt, scalar_tensor(got_loss)), want);
      }
    }
    // A GPU stage and a host stage; with two GPUs also cuda:0 -> cuda:1 (event-ordered peer
    // copies, Note [Copies between GPUs]). The reference is the same batch on the host.
    SECTION(pipeline_name(kind) + ": cuda:0 + cpu:0, and cuda:0 + cuda:1 when there are two") {
      auto ref = test::tiny_gpt(kCPU, 0.0);
      const int64_t B = 5, T = 12, micro = 2;
      const Tensor idx = test::random_tokens(B, T, 40, 21, kCPU), tgt = test::random_tokens(B, T, 40, 22, kCPU);
      manual_seed(5);
      const double loss = micro_batched(*ref, idx, tgt, micro);
      const test::StepResult want = test::collect(*ref, scalar_tensor(loss));
      std::vector<std::vector<Device>> splits{{kGPU, kCPU}, {kCPU, kGPU}};
      if (cuda::device_count() >= 2) splits.push_back({kGPU, Device("cuda:1")});
      else WARN("cuda:0 + cuda:1 skipped: one CUDA device");
      for (const auto& devices : splits) {
        INFO(devices[0].str() << " + " << devices[1].str());
        for (int repeat = 0; repeat < 2; ++repeat) check_close(pipelined(devices, {2, 2}, kind, 0.0), want);
      }
    }
  }
}
