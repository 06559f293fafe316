// memgrad's side of bench/compare_pytorch: one fp32 training step (forward, backward, AdamW lr
// 3e-4 wd 0.01, dropout 0) of a named model on random data, repeated, printing one JSON line:
// the median ms per step, and the allocator's peak allocated bytes over one step after warm-up
// (absolute, and the growth above what was live when the step began).
// Batches: 8 sequences for gpt-mini and gpt-small, 1 x 1024 tokens for gpt2-124m (one sequence of
// GPT-2 small, an optional workload of bench/compare_pytorch), 64 images for mobilenetv2-32.
// Usage: compare_step <gpt-mini|gpt-small|gpt2-124m|mobilenetv2-32> [--steps N] [--warmup N] [--threads N]
//        [--profile-ops]   (then also a per-op self-time table of the timed steps on stderr)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/memory_category.h"
#include "core/op_timer.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/cpu_gemm.h"
#include "ops/ops.h"
#include "optim/adam.h"

using namespace mg;

namespace {

Tensor normal_tensor(const Shape& s, uint64_t seed) {
  Tensor t = empty(s);
  float* p = t.data<float>();
  Generator gen(seed);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = gen.normal_at(uint64_t(i));
  return t;
}

Tensor index_tensor(const Shape& s, int64_t high, uint64_t seed) {
  Tensor t = empty(s, {.dtype = DType::i64});
  int64_t* p = t.data<int64_t>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = int64_t(x % uint64_t(high));
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s <gpt-mini|gpt-small|gpt2-124m|mobilenetv2-32> [--steps N] [--warmup N] [--threads N] "
                 "[--profile-ops]\n",
                 argv[0]);
    return 2;
  }
  const std::string model = argv[1];
  int steps = 10, warmup = 3, threads = 2;
  bool profile_ops = false;
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--profile-ops") {
      profile_ops = true;
      --i;  // a flag without a value
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "compare_step: %s needs a value\n", flag.c_str());
      return 2;
    }
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--steps") steps = v;
    else if (flag == "--warmup") warmup = v;
    else if (flag == "--threads") threads = v;
    else {
      std::fprintf(stderr, "compare_step: unknown flag '%s' (known: --steps, --warmup, --threads, --profile-ops)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (steps < 1 || warmup < 1 || threads < 1) {
    std::fprintf(stderr, "compare_step: --steps, --warmup and --threads must be >= 1\n");
    return 2;
  }
  set_num_threads(threads);

  std::function<Tensor()> loss_fn;
  std::shared_ptr<GPT> gpt;
  std::shared_ptr<MobileNetV2> mnet;
  Tensor x, y;
  NamedTensors params;
  if (model.rfind("gpt", 0) == 0) {
    GPTConfig cfg = GPTConfig::named(model);
    cfg.dropout = 0.0;
    const int64_t B = model == "gpt2-124m" ? 1 : 8, T = cfg.context;
    gpt = std::make_shared<GPT>(cfg);
    x = index_tensor({B, T}, cfg.vocab_size, 1);
    y = index_tensor({B, T}, cfg.vocab_size, 2);
    params = gpt->named_parameters();
    loss_fn = [&] { return gpt->loss(x, y); };
  } else {
    MobileNetV2Config cfg = MobileNetV2Config::named(model);
    cfg.dropout = 0.0;
    const int64_t B = 64;
    mnet = std::make_shared<MobileNetV2>(cfg);
    x = normal_tensor({B, cfg.in_channels, cfg.input_size, cfg.input_size}, 3);
    y = index_tensor({B}, cfg.num_classes, 4);
    params = mnet->named_parameters();
    loss_fn = [&] { return cross_entropy(mnet->forward(x), y); };
  }
  AdamW opt(params, 3e-4, 0.01);

  auto step = [&] {
    opt.zero_grad();
    Tensor loss = loss_fn();
    backward(loss);
    OpNameGuard name("optimizer.step");  // a named scope for --profile-ops
    opt.step();
    return loss.item<float>();
  };
  for (int i = 0; i < warmup; ++i) step();

  // Memory over one step after warm-up.
  opt.zero_grad();
  const int64_t live_before = memory_stats(kCPU).allocated.current;
  reset_peak_stats(kCPU);
  step();
  const int64_t peak = memory_stats(kCPU).allocated.peak;

  std::vector<double> ms;
  float last = 0.0f;
  set_op_timing(profile_ops);
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    last = step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  set_op_timing(false);
  if (profile_ops) {
    double total = 0;
    for (double v : ms) total += v;
    std::fprintf(stderr, "compare_step %s: per-op self time over %d steps\n%s", model.c_str(), steps,
                 op_time_table(total, steps).c_str());
  }
  std::string all;
  for (double v : ms) all += (all.empty() ? "" : ", ") + std::to_string(v);
  std::sort(ms.begin(), ms.end());
  const double median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  std::printf(
      "{\"model\": \"%s\", \"impl\": \"memgrad\", \"gemm\": \"%s\", \"threads\": %d, \"steps\": %d, \"ms_median\": %.3f, "
      "\"ms_min\": %.3f, \"peak_bytes\": %lld, \"live_before_bytes\": %lld, \"step_growth_bytes\": %lld, "
      "\"loss\": %.7f, \"ms\": [%s]}\n",
      model.c_str(), cpu_gemm_backend(), threads, steps, median, ms.front(), (long long)peak, (long long)live_before,
      (long long)(peak - live_before), double(last), all.c_str());
  return 0;
}
