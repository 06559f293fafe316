// Mixed precision on the CPU: how much a 16-bit step costs next to fp32. Times (medians) of
//   - GEMMs through mg::matmul in f32, bf16 and f16 (16-bit tiles converted inside cpu_gemm), and
//   - full training steps (forward, backward, AdamW) of gpt-mini (8 x 128 tokens) and
//     mobilenetv2-32 (batch 64) in fp32, bf16 / fp16 autocast (fp16 with a GradScaler) and
//     bf16-pure (bf16 parameters, f32 masters in AdamW),
// each printed with its ratio to fp32 (the target: <= 1.15x).
// Run: OMP_NUM_THREADS=2 build/<dir>/bench/bench_precision [--steps N] [--skip-mobilenet] [--skip-gpt]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"

namespace {

using namespace mg;
using Clock = std::chrono::steady_clock;

double median_ms(int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor uniform(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t = empty(s);
  Generator gen(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(lo + (hi - lo) * gen.uniform_at(uint64_t(i)));
  return t;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor t = empty({B, T}, {.dtype = DType::i64});
  Generator gen(seed);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = int64_t(gen.uniform_at(uint64_t(i)) * double(V)) % V;
  return t;
}

enum class Mode { fp32, bf16, fp16, bf16_pure };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::fp32: return "fp32";
    case Mode::bf16: return "bf16 autocast";
    case Mode::fp16: return "fp16 autocast + GradScaler";
    case Mode::bf16_pure: return "bf16-pure";
  }
  return "?";
}

// One training step of `loss_fn` in mode m; the model's parameters are already in the mode's dtype.
void train_step(Mode m, Module& model, Optimizer& opt, GradScaler& scaler, const std::function<Tensor()>& loss_fn) {
  if (m == Mode::fp32 || m == Mode::bf16_pure) {
    backward(loss_fn());
    opt.step();
  } else {
    Tensor loss;
    {
      AutocastGuard amp(m == Mode::bf16 ? DType::bf16 : DType::f16);
      loss = loss_fn();
    }
    if (m == Mode::fp16) {
      backward(scaler.scale(loss));
      scaler.step(opt);
    } else {
      backward(loss);
      opt.step();
    }
  }
  opt.zero_grad();
}

void bench_gemms(int reps) {
  std::printf("\nGEMM through mg::matmul (median of %d, ms; ratio to f32)\n", reps);
  std::printf("%-22s %10s %10s %8s %10s %8s\n", "shape (M x K) x (K x N)", "f32", "bf16", "ratio", "f16", "ratio");
  const int64_t shapes[][3] = {{1024, 256, 1024}, {1024, 1024, 256}, {1024, 256, 256}, {1024, 1024, 1024}};
  for (const auto& s : shapes) {
    Tensor a = uniform({s[0], s[1]}, 1), b = uniform({s[1], s[2]}, 2);
    double t[3];
    int k = 0;
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Tensor a2 = cast(a, dt), b2 = cast(b, dt);
      t[k++] = median_ms(2, reps, [&] { (void)matmul(a2, b2); });
    }
    char name[64];
    std::snprintf(name, sizeof name, "(%ld x %ld) x (%ld x %ld)", long(s[0]), long(s[1]), long(s[1]), long(s[2]));
    std::printf("%-22s %10.3f %10.3f %7.2fx %10.3f %7.2fx\n", name, t[0], t[1], t[1] / t[0], t[2], t[2] / t[0]);
  }
}

// The four modes' models are built once and their steps interleaved (fp32, bf16, fp16,
// bf16-pure, fp32, ...), so a load change on a shared machine hits every mode alike; each mode's
// time is the median of its `steps` timed steps after 2 warm-up steps.
template <class MakeModel>
void bench_model(const char* title, int steps, MakeModel make) {
  std::printf("\n%s: one training step, median of %d interleaved steps after 2 warm-up steps (ms; ratio to fp32)\n",
              title, steps);
  struct Run {
    Mode mode;
    std::shared_ptr<Module> model;
    std::function<Tensor()> loss_fn;
    std::unique_ptr<AdamW> opt;
    GradScaler scaler;
    std::vector<double> ms;
  };
  std::vector<std::unique_ptr<Run>> runs;
  for (Mode m : {Mode::fp32, Mode::bf16, Mode::fp16, Mode::bf16_pure}) {
    auto r = std::make_unique<Run>();
    r->mode = m;
    make(r->model, r->loss_fn, m == Mode::bf16_pure);  // bf16-pure: bf16 parameters and inputs
    if (m == Mode::bf16_pure) r->model->to(DType::bf16);
    r->opt = std::make_unique<AdamW>(weight_decay_groups(r->model->named_parameters(), 3e-4, 0.01));
    runs.push_back(std::move(r));
  }
  auto step = [](Run& r) { train_step(r.mode, *r.model, *r.opt, r.scaler, r.loss_fn); };
  for (auto& r : runs)
    for (int i = 0; i < 2; ++i) step(*r);
  for (int i = 0; i < steps; ++i)
    for (auto& r : runs) {
      auto t0 = Clock::now();
      step(*r);
      r->ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  double base = 0;
  for (auto& r : runs) {
    std::sort(r->ms.begin(), r->ms.end());
    const double ms = r->ms[r->ms.size() / 2];
    if (r->mode == Mode::fp32) base = ms;
    std::printf("  %-28s %9.1f ms  %5.2fx\n", mode_name(r->mode), ms, ms / base);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10;
  bool mobilenet = true, gpt = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--skip-mobilenet")) mobilenet = false;
    else if (!std::strcmp(argv[i], "--skip-gpt")) gpt = false;
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--skip-mobilenet] [--skip-gpt]\n", argv[0]);
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench_gemms(steps);
  if (gpt)
    bench_model("gpt-mini (8 x 128 tokens)", steps, [](std::shared_ptr<Module>& model, std::function<Tensor()>& loss, bool) {
    GPTConfig cfg = GPTConfig::named("gpt-mini");
    Generator gen(0);
    auto gpt = std::make_shared<GPT>(cfg, InitOptions{.gen = &gen});
    Tensor x = tokens(8, 128, cfg.vocab_size, 11), y = tokens(8, 128, cfg.vocab_size, 12);
    loss = [gpt, x, y] { return gpt->loss(x, y); };
    model = gpt;
  });
  if (mobilenet)
    bench_model("mobilenetv2-32 (batch 64)", steps, [](std::shared_ptr<Module>& model, std::function<Tensor()>& loss, bool pure) {
      MobileNetV2Config cfg = MobileNetV2Config::named("mobilenetv2-32");
      cfg.dropout = 0.0;
      Generator gen(0);
      auto net = std::make_shared<MobileNetV2>(cfg, InitOptions{.gen = &gen});
      Tensor x = uniform({64, 3, 32, 32}, 21), y = tokens(64, 1, cfg.num_classes, 22);
      Tensor y1 = reshape(y, {64});
      if (pure) x = cast(x, DType::bf16);
      loss = [net, x, y1] { return cross_entropy(net->forward(x), y1); };
      model = net;
    });
  return 0;
}
