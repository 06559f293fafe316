// Pipeline workers' overlap: a GPT cut into stages (stages:K over cpu:0..cpu:K-1) runs the same
// GPipe / 1F1B schedule twice per step count, once with a worker thread per stage (each with its
// share of the cores) and once step by step on the calling thread (all cores per op), and prints
// the median step time (forward + backward + AdamW) of each, their ratio, and whether both gave
// the same loss bits. The whole batch on one device with all cores is the baseline.
// Usage: pipeline_overlap [--model gpt-small|gpt-mini] [--stages 2] [--micro 2,1] [--steps 4]
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
#include "ops/ops.h"
#include "parallel/pipeline.h"
#include "parallel/split.h"

using namespace mg;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed, Device d) {
  Generator g(seed);
  std::vector<int64_t> v(size_t(B * T));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(g.bits_at(i) % uint32_t(vocab));
  return from_vector(v, {B, T}, TensorOptions{.dtype = DType::i64, .device = d});
}

struct Timing {
  double ms = 0;
  double first_loss = 0;
};

// steps + 1 steps from the same initial weights (the first is warm-up); median ms of the rest.
Timing time_steps(const StepProbe& probe, const std::vector<Device>& devices, int64_t micro, PipelineKind kind,
                  PipelineExecution exec, bool pipelined, int steps, const GPTConfig& cfg) {
  const int64_t B = 8;
  auto net = std::dynamic_pointer_cast<GPT>(probe.build(devices.front()));
  const std::vector<int64_t> counts = equal_counts(cfg.n_layer, int64_t(devices.size()));
  if (pipelined) apply_placement(*net, stages_placement(model_layout(*net), devices, counts));
  auto opt = probe.optimizer(*net);
  const Tensor idx = tokens(B, cfg.context, cfg.vocab_size, 1, devices.front());
  const Tensor tgt = tokens(B, cfg.context, cfg.vocab_size, 2, devices.front());
  const PipelineSchedule sched = make_schedule(kind, int64_t(counts.size()), num_micro_batches(B, micro));
  std::vector<double> ms;
  Timing t;
  for (int step = 0; step <= steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss;
    if (pipelined) {
      loss = run_pipeline(sched, gpt_pipeline_stages(*net, counts, idx, tgt, micro), B, micro, exec);
    } else {
      Tensor l = net->loss(idx, tgt);
      backward(l);
      loss = l.item<double>();
    }
    opt->step();
    opt->zero_grad();
    if (step == 0) t.first_loss = loss;
    else ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  t.ms = median(ms);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt-small", micro_arg = "2,1";
  int64_t stages = 2;
  int steps = 4;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "pipeline_overlap: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model")) model = value();
    else if (!std::strcmp(argv[i], "--stages")) stages = std::atoll(value().c_str());
    else if (!std::strcmp(argv[i], "--micro")) micro_arg = value();
    else if (!std::strcmp(argv[i], "--steps")) steps = std::max(1, std::atoi(value().c_str()));
    else {
      std::fprintf(stderr, "pipeline_overlap: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  try {
    const GPTConfig cfg = GPTConfig::named(model);
    MG_CHECK(stages >= 2 && stages <= cfg.n_layer, "--stages must be in [2, ", cfg.n_layer, "]");
    std::vector<Device> devices;
    for (int64_t s = 0; s < stages; ++s) devices.emplace_back(DeviceType::cpu, int(s));
    const StepProbe probe = gpt_step_probe(cfg, 8, cfg.context);
    std::printf("%s, batch 8 x %lld, AdamW, %d threads, stages:%lld over cpu:0..cpu:%lld; medians of %d steps\n",
                model.c_str(), (long long)cfg.context, num_threads(), (long long)stages, (long long)stages - 1, steps);
    const Timing whole = time_steps(probe, {devices.front()}, 8, PipelineKind::gpipe, PipelineExecution::sequential,
                                    false, steps, cfg);
    std::printf("one device, whole batch: %.0f ms/step\n", whole.ms);
    std::vector<int64_t> micros;
    for (size_t pos = 0; pos <= micro_arg.size();) {
      const size_t comma = std::min(micro_arg.find(',', pos), micro_arg.size());
      micros.push_back(std::atoll(micro_arg.substr(pos, comma - pos).c_str()));
      pos = comma + 1;
    }
    std::printf("%-6s %6s %6s %14s %14s %8s %8s %s\n", "sched", "micro", "m", "sequential ms", "workers ms", "speedup",
                "bubble", "same loss");
    for (int64_t micro : micros) {
      for (PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b}) {
        const Timing seq = time_steps(probe, devices, micro, kind, PipelineExecution::sequential, true, steps, cfg);
        const Timing par = time_steps(probe, devices, micro, kind, PipelineExecution::workers, true, steps, cfg);
        const int64_t M = num_micro_batches(8, micro);
        std::printf("%-6s %6lld %6lld %14.0f %14.0f %7.2fx %8.3f %s\n", pipeline_name(kind).c_str(), (long long)micro,
                    (long long)M, seq.ms, par.ms, seq.ms / par.ms, PipelineSchedule::theoretical_bubble(stages, M),
                    seq.first_loss == par.first_loss ? "yes" : "NO");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_overlap: %s\n", e.what());
    return 1;
  }
  return 0;
}
