// `memgrad mlp`: the smallest real training run. An MLP learns two interleaved spirals with
// AdamW and cross-entropy; the command prints the loss curve, the held-out accuracy, the time,
// and the allocator's statistics by category. Before training it runs one step on the meta
// device, which predicts the step's peak memory without touching data; the real peak must match.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "data/synthetic.h"
#include "models/nn/nn.h"
#include "ops/ops.h"
#include "optim/optim.h"

namespace mg {
namespace {

struct MlpOptions {
  int64_t steps = 400;
  int64_t hidden = 256;
  int64_t points = 1024;  // per class, training set; the test set has the same size
  double lr = 3e-3;
  uint64_t seed = 1;
  std::string device = "cpu:0";
  std::string memory_limit;
};

std::shared_ptr<Sequential> make_mlp(int64_t hidden, InitOptions init) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<UnaryModule>>{
      std::make_shared<Linear>(2, hidden, true, init), std::make_shared<ReLU>(),
      std::make_shared<Linear>(hidden, hidden, true, init), std::make_shared<ReLU>(),
      std::make_shared<Linear>(hidden, 2, true, init)});
}

// One training step of the MLP on `device`; returns the loss tensor.
Tensor train_step(Sequential& net, AdamW& opt, const LabeledPoints& batch) {
  Tensor loss = cross_entropy(net.forward(batch.x), batch.y);
  backward(loss);
  opt.step();
  opt.zero_grad();
  return loss;
}

// Peak allocated bytes of one step, measured on meta (shapes and bytes only, no arithmetic).
int64_t predict_step_peak(const MlpOptions& o) {
  Generator gen(o.seed);
  auto net = make_mlp(o.hidden, {.gen = &gen, .device = kMeta});
  AdamW opt(weight_decay_groups(net->named_parameters(), o.lr, 0.01));
  // The same training and test sets as the real run (only their bytes: meta holds no data).
  LabeledPoints batch, test;
  {
    MemoryCategoryGuard tag(MemoryCategory::input);
    batch = {empty({2 * o.points, 2}, {.device = kMeta}), empty({2 * o.points}, {.dtype = DType::i64, .device = kMeta})};
    test = {empty({2 * o.points, 2}, {.device = kMeta}), empty({2 * o.points}, {.dtype = DType::i64, .device = kMeta})};
  }
  train_step(*net, opt, batch);  // first step: creates the optimizer state
  reset_peak_stats(kMeta);
  train_step(*net, opt, batch);  // steady state
  return memory_stats(kMeta).allocated.peak;
}

double accuracy(Sequential& net, const LabeledPoints& d) {
  NoGradGuard no_grad;
  auto pred = argmax(net.forward(d.x), 1).to_vector<int64_t>();
  auto truth = d.y.to_vector<int64_t>();
  int64_t right = 0;
  for (size_t i = 0; i < pred.size(); ++i) right += pred[i] == truth[i];
  return double(right) / double(pred.size());
}

void run_mlp(const MlpOptions& o) {
  Device device(o.device);
  if (!o.memory_limit.empty()) set_memory_limit(device, parse_bytes(o.memory_limit));
  MG_CHECK(o.steps > 0 && o.hidden > 0 && o.points > 0, "mlp: --steps, --hidden and --points must be positive");
  int64_t predicted = predict_step_peak(o);

  Generator gen(o.seed);
  auto net = make_mlp(o.hidden, {.gen = &gen, .device = device});
  Generator data_gen(o.seed + 1000);
  LabeledPoints train = two_spirals(o.points, data_gen, 0.02, device);
  LabeledPoints test = two_spirals(o.points, data_gen, 0.02, device);
  AdamW opt(weight_decay_groups(net->named_parameters(), o.lr, 0.01));
  LrSchedule sched = LrSchedule::cosine(o.lr, o.steps / 20, o.steps, o.lr / 10);
  std::printf("memgrad mlp: 2 -> %lld -> %lld -> 2 (%lld parameters), %lld training points, AdamW, %s on %s\n",
              (long long)o.hidden, (long long)o.hidden, (long long)net->num_parameters(),
              (long long)(2 * o.points), sched.str().c_str(), device.str().c_str());

  auto t0 = std::chrono::steady_clock::now();
  int64_t measured = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    opt.set_lr(sched(step));
    if (step == 1) reset_peak_stats(device);
    Tensor loss = train_step(*net, opt, train);
    if (step == 1) measured = memory_stats(device).allocated.peak;
    if (step % (o.steps / 8 > 0 ? o.steps / 8 : 1) == 0 || step == o.steps - 1)
      std::printf("  step %5lld  loss %.4f  lr %.2e\n", (long long)step, loss.item(), sched(step));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("test accuracy %.2f%%  train accuracy %.2f%%  %.2f s (%.2f ms/step)\n", 100 * accuracy(*net, test),
              100 * accuracy(*net, train), secs, 1000 * secs / double(o.steps));
  std::printf("peak allocated per step: predicted on meta %s, measured on %s %s (%s)\n",
              format_bytes(predicted).c_str(), device.str().c_str(), format_bytes(measured).c_str(),
              predicted == measured ? "exact" : "MISMATCH");
  std::printf("%s", memory_summary(device).c_str());
  MG_CHECK(predicted == measured, "mlp: the meta prediction ", predicted, " B differs from the measured peak ",
           measured, " B");
}

}  // namespace

void add_mlp_command(CLI::App& app) {
  auto opts = std::make_shared<MlpOptions>();
  CLI::App* cmd = app.add_subcommand("mlp", "Train an MLP on two spirals and show loss, accuracy and memory");
  cmd->add_option("--steps", opts->steps, "training steps")->capture_default_str();
  cmd->add_option("--hidden", opts->hidden, "hidden width")->capture_default_str();
  cmd->add_option("--points", opts->points, "training points per class")->capture_default_str();
  cmd->add_option("--lr", opts->lr, "peak learning rate (cosine schedule with warmup)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "seed for weights and data")->capture_default_str();
  cmd->add_option("--device", opts->device, "device, e.g. cpu:0")->capture_default_str();
  cmd->add_option("--memory-limit", opts->memory_limit, "memory budget of the device, e.g. 8MiB");
  cmd->callback([opts] { run_mlp(*opts); });
}

}  // namespace mg
