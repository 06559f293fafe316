// End to end: an MLP (Linear 2->32, ReLU, Linear 32->32, ReLU, Linear 32->2) trained with AdamW
// and cross_entropy on two interleaved spirals, data drawn from a seeded Generator, must classify
// a held-out set of the same spirals with > 95% accuracy (speed is measured by `memgrad mlp`, not asserted here). It exercises
// the whole path: layers, autograd, optimizer groups, schedule and zero_grad, plus determinism
// (two runs from one seed give the same loss bit for bit).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "data/synthetic.h"
#include "models/nn/layers.h"
#include "optim/adam.h"
#include "optim/lr_schedule.h"

using namespace mg;

namespace {

using Dataset = LabeledPoints;

double accuracy(Sequential& net, const Dataset& d) {
  NoGradGuard no_grad;
  auto pred = argmax(net.forward(d.x), 1).to_vector<int64_t>();
  auto truth = d.y.to_vector<int64_t>();
  int64_t right = 0;
  for (size_t i = 0; i < pred.size(); ++i) right += pred[i] == truth[i];
  return double(right) / double(pred.size());
}

struct RunResult {
  double test_accuracy;
  double final_loss;
};

RunResult train_spirals(uint64_t seed, int64_t steps) {
  Generator gen(seed);
  const Dataset train = two_spirals(256, gen), test = two_spirals(256, gen);
  InitOptions init{.gen = &gen};
  Sequential net({std::make_shared<Linear>(2, 32, true, init), std::make_shared<ReLU>(),
                  std::make_shared<Linear>(32, 32, true, init), std::make_shared<ReLU>(),
                  std::make_shared<Linear>(32, 2, true, init)});
  AdamW opt(weight_decay_groups(net.named_parameters(), 0.02, 1e-4));
  const LrSchedule sched = LrSchedule::cosine(0.02, 20, steps, 0.002);
  double loss_value = 0;
  for (int64_t step = 0; step < steps; ++step) {
    opt.set_lr(sched(step));
    Tensor loss = cross_entropy(net.forward(train.x), train.y);  // full batch of 512 points
    backward(loss);
    opt.step();
    opt.zero_grad();
    loss_value = loss.item();
  }
  return {accuracy(net, test), loss_value};
}

}  // namespace

TEST_CASE("e2e: an MLP learns two spirals with AdamW", "[e2e]") {
  const auto start = std::chrono::steady_clock::now();
  RunResult r = train_spirals(2024, 600);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("held-out accuracy " << r.test_accuracy << ", final loss " << r.final_loss << ", " << seconds << " s");
  CHECK(r.test_accuracy > 0.95);
  CHECK(r.final_loss < 0.2);
  // The same seed gives the same run, bit for bit.
  CHECK(train_spirals(2024, 50).final_loss == train_spirals(2024, 50).final_loss);
}
