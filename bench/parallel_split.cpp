// Model parallelism's memory effect: a named workload trained on one device, then split over
// several (--split balanced by default) with the same optimizer (AdamW) and batch. Prints the
// predicted (meta) and measured per-device peaks by category over one step after warm-up, the
// largest split peak against the single-device peak, and the median step time of each run.
// Usage: parallel_split [--model gpt-small|gpt-mini|mobilenetv2-32] [--devices cpu:0,cpu:1]
//                       [--split balanced|stages:K|attention-mlp] [--steps N] [--meta-only]
//                       [--micro-batch M]  (GPT with balanced / stages: also GPipe vs 1F1B)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "parallel/pipeline.h"
#include "parallel/split.h"

using namespace mg;

namespace {

struct Run {
  std::vector<DevicePeak> peaks;
  double median_ms = 0;
};

// steps training steps (the first is warm-up); peaks of the last step.
Run run_steps(const StepProbe& probe, const Placement& placement, int steps) {
  const std::vector<Device> devices = placement.devices();
  for (const Device& d : devices) empty_cache(d);  // empty pools, as measure_on_meta starts from
  auto model = probe.build(devices.front());
  const ResolvedPlacement r = apply_placement(*model, placement);
  auto opt = probe.optimizer(*model);
  std::vector<double> ms;
  for (int step = 0; step < steps; ++step) {
    for (const Device& d : devices) reset_peak_stats(d);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss = probe.loss(*model);
    backward(loss);
    loss = Tensor();
    opt->step();
    opt->zero_grad();
    if (step > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  Run out{device_peaks(devices), 0};
  for (auto& p : out.peaks) p.modules = r.modules_on(p.device);
  std::sort(ms.begin(), ms.end());
  out.median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  return out;
}

int64_t largest(const std::vector<DevicePeak>& p) {
  int64_t m = 0;
  for (const auto& d : p) m = std::max(m, d.peak);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt-small", devices_arg = "cpu:0,cpu:1", split_arg = "balanced";
  int steps = 3;
  int64_t micro = 0;
  bool meta_only = false;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "parallel_split: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model")) model = value();
    else if (!std::strcmp(argv[i], "--devices")) devices_arg = value();
    else if (!std::strcmp(argv[i], "--split")) split_arg = value();
    else if (!std::strcmp(argv[i], "--steps")) steps = std::max(2, std::atoi(value().c_str()));
    else if (!std::strcmp(argv[i], "--meta-only")) meta_only = true;
    else if (!std::strcmp(argv[i], "--micro-batch")) micro = std::atoll(value().c_str());
    else {
      std::fprintf(stderr, "parallel_split: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  try {
    const std::vector<Device> devices = parse_devices(devices_arg);
    StepProbe probe;
    if (model.rfind("gpt", 0) == 0) probe = gpt_step_probe(GPTConfig::named(model), 8, GPTConfig::named(model).context);
    else probe = mobilenet_step_probe(MobileNetV2Config::named(model), 64, MobileNetV2Config::named(model).input_size);
    auto shape_model = probe.build(kMeta);
    const ModelLayout layout = model_layout(*shape_model);
    Placement single;
    for (const auto& leaf : layout.leaves) single.entries.emplace_back(leaf, devices.front());
    BalancedPlan plan;
    const Placement split = split_placement(SplitSpec::parse(split_arg), *shape_model, devices, &probe, &plan);
    const std::vector<DevicePeak> single_pred = measure_on_meta(probe, single);
    const std::vector<DevicePeak> split_pred = measure_on_meta(probe, split);
    std::printf("%s, AdamW, %d threads; split %s over %s: %s\n", model.c_str(), num_threads(), split_arg.c_str(),
                devices_arg.c_str(), split.str().c_str());
    if (!plan.counts.empty()) std::printf("%s", plan.str().c_str());
    if (meta_only) {
      std::printf("single device (predicted on meta):\n%s", device_peaks_table(single_pred).c_str());
      std::printf("split (predicted on meta):\n%s", device_peaks_table(split_pred).c_str());
      std::printf("largest split peak / single-device peak: %.3f (predicted)\n",
                  double(largest(split_pred)) / double(largest(single_pred)));
      return 0;
    }
    const Run one = run_steps(probe, single, steps);
    const Run many = run_steps(probe, split, steps);
    std::printf("single device, measured (predicted), median step %.0f ms:\n%s", one.median_ms,
                device_peaks_table(one.peaks, single_pred).c_str());
    std::printf("split, measured (predicted), median step %.0f ms:\n%s", many.median_ms,
                device_peaks_table(many.peaks, split_pred).c_str());
    std::printf("largest split peak / single-device peak: %.3f measured, %.3f predicted\n",
                double(largest(many.peaks)) / double(largest(one.peaks)),
                double(largest(split_pred)) / double(largest(single_pred)));
    if (micro > 0) {
      // Pipeline schedules over the split's stages: stage 0's activation peak and the step time.
      MG_CHECK(model.rfind("gpt", 0) == 0 && split_arg != "attention-mlp",
               "--micro-batch: the pipeline runs GPT stages (balanced or stages:K)");
      std::vector<int64_t> counts = plan.counts;
      if (counts.empty()) counts = equal_counts(int64_t(layout.blocks.size()), int64_t(devices.size()));
      const GPTConfig cfg = GPTConfig::named(model);
      const int64_t B = 8, p = int64_t(counts.size()), M = num_micro_batches(B, micro);
      for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
        for (const Device& d : devices) empty_cache(d);
        auto net = std::dynamic_pointer_cast<GPT>(probe.build(devices.front()));
        apply_placement(*net, split);
        auto opt = probe.optimizer(*net);
        const Tensor idx = zeros({B, cfg.context}, {.dtype = DType::i64, .device = devices.front()});
        const PipelineSchedule sched = make_schedule(kind, p, M);
        double ms = 0;
        for (int step = 0; step < 2; ++step) {  // a warm-up step (optimizer state), then the measured one
          for (const Device& d : devices) reset_peak_stats(d);
          const int64_t act0 = memory_stats(devices.front()).category(MemoryCategory::activation).current;
          const auto t0 = std::chrono::steady_clock::now();
          run_pipeline(sched, gpt_pipeline_stages(*net, counts, idx, idx, micro), B, micro);
          opt->step();
          opt->zero_grad();
          ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (step == 1)
            std::printf("%-5s p=%lld m=%lld: stage 0 activation peak %s, device peaks %s / %s, step %.0f ms, schedule bubble %.3f\n",
                        pipeline_name(kind).c_str(), (long long)p, (long long)M,
                        format_bytes(memory_stats(devices.front()).category(MemoryCategory::activation).peak - act0).c_str(),
                        format_bytes(memory_stats(devices.front()).allocated.peak).c_str(),
                        format_bytes(memory_stats(devices.back()).allocated.peak).c_str(), ms, sched.bubble_fraction());
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_split: %s\n", e.what());
    return 1;
  }
  return 0;
}
