// Quantization-aware training (models/compress/qat.h): prepare_qat wraps the right layers, the
// Trainer trains them (observers move once per training forward, frozen in eval and in checkpoint
// recomputation: checkpointed gradients stay bit-identical), autocast and accumulation run, the
// converted int8 model computes what the fake-quant model computed, and the errors are clear.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "models/compress/qat.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/trainer.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;

namespace {

MobileNetV2Config tiny_net() {
  return {.width_mult = 0.25, .num_classes = 10, .small_input = true, .dropout = 0.0, .input_size = 16};
}

// A tiny MobileNetV2 with its BatchNorms folded (the same weights every call).
std::shared_ptr<MobileNetV2> folded_net() {
  Generator g(5);
  auto net = std::make_shared<MobileNetV2>(tiny_net(), InitOptions{.gen = &g});
  net->eval();
  fold_batch_norms(*net);
  return net;
}

Tensor images(int64_t n, uint64_t seed) { return rand_tensor({n, 3, 16, 16}, seed, DType::f32, -2, 2); }
Tensor labels(int64_t n, uint64_t seed) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(double((i * 7 + seed) % 10));
  return from_vector(v, {n}, {.dtype = DType::i64});
}

template <class F>
void for_each_fake_quant(Module& m, F&& f) {
  for (auto& [name, mod] : m.named_modules())
    if (auto* fq = dynamic_cast<FakeQuantLayer*>(mod)) f(name, *fq);
}

void train_steps(MobileNetV2& net, int64_t steps, TrainerOptions topt, int64_t batch = 4) {
  net.train();
  AdamW opt(net.named_parameters(), 1e-3);
  Trainer t(net, opt, topt);
  for (int64_t s = 0; s < steps; ++s) {
    Tensor x = images(batch, 100 + uint64_t(s)), y = labels(batch, uint64_t(s));
    const StepReport r = t.step(batch, [&](int64_t b, int64_t n) {
      return cross_entropy(net(narrow(x, 0, b, n)), narrow(y, 0, b, n));
    });
    REQUIRE(std::isfinite(r.loss));
  }
}

}  // namespace

TEST_CASE("QAT: prepare, train with the Trainer, convert; int8 output equals the fake-quant output", "[quant][qat]") {
  auto net = folded_net();
  int64_t convs = 0, pointwise = 0;
  for (auto& [name, m] : net->named_modules())
    if (auto* c = dynamic_cast<Conv2d*>(m)) ++convs, pointwise += runs_int8(*c);
  const int64_t wrapped = prepare_qat(*net);
  CHECK(wrapped == convs + 1);  // every conv and the classifier
  train_steps(*net, 2, {}, 2);
  int64_t inputs = 0;
  for_each_fake_quant(*net, [&](const std::string& name, FakeQuantLayer& fq) {
    if (!fq.takes_int8_input()) return;
    ++inputs;
    INFO(name);
    CHECK(fq.observed_batches() == 2);
    CHECK(fq.input_lo.item<float>() <= fq.input_hi.item<float>());
  });
  CHECK(inputs == pointwise + 1);
  const NamedTensors state = net->state_dict();  // the observer state is in the checkpointed state
  CHECK(std::count_if(state.begin(), state.end(), [](const auto& kv) { return kv.first == "classifier.1.input_lo"; }) == 1);

  net->eval();
  NoGradGuard ng;
  Tensor x = images(6, 7);
  Tensor y_fake = (*net)(x);
  Tensor y_fake2 = (*net)(x);
  CHECK(y_fake.to_vector<float>() == y_fake2.to_vector<float>());  // eval does not move the observers
  const ConvertCounts n = convert_qat(*net);
  CHECK(n.int8 == pointwise + 1);
  CHECK(n.weight_only == convs - pointwise);
  Tensor y_int8 = (*net)(x);
  // Stated tolerance: the int8 GEMM sums in int32 and rescales once, the fake-quant model sums
  // the same products in f32, so only rounding order differs; an activation that lands on the
  // other side of a rounding boundary moves one step (scale) in the next layer. Bound: 0.1% of
  // the largest logit (measured here: 1e-7 of it, no boundary crossed); predictions agree.
  const auto a = y_fake.to_vector<float>(), b = y_int8.to_vector<float>();
  double big = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) big = std::max(big, std::abs(double(a[i]))), diff = std::max(diff, std::abs(double(a[i] - b[i])));
  UNSCOPED_INFO("int8 vs fake-quant: max diff " << diff << ", largest logit " << big);
  CHECK(diff <= 1e-3 * big);
  CHECK(argmax(y_fake, 1).to_vector<int64_t>() == argmax(y_int8, 1).to_vector<int64_t>());
  CHECK_THROWS_WITH(convert_qat(*net), Catch::Contains("no FakeQuantLayer"));
}

TEST_CASE("QAT with checkpointing (bit-identical gradients), autocast and accumulation", "[quant][qat]") {
  auto plain = folded_net(), ckpt = folded_net();
  prepare_qat(*plain);
  prepare_qat(*ckpt);
  ckpt->set_checkpoint(CheckpointPolicy::parse("blocks"));
  Tensor x = images(2, 3), y = labels(2, 1);
  for (auto* net : {plain.get(), ckpt.get()}) {
    net->train();
    backward(cross_entropy((*net)(x), y));
  }
  const auto gp = plain->named_parameters(), gc = ckpt->named_parameters();
  REQUIRE(gp.size() == gc.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    INFO(gp[i].first);
    REQUIRE(gc[i].second.grad().defined());
    CHECK(gp[i].second.grad().to_vector<float>() == gc[i].second.grad().to_vector<float>());
  }
  for_each_fake_quant(*ckpt, [](const std::string& name, FakeQuantLayer& fq) {
    INFO(name);
    if (fq.takes_int8_input()) CHECK(fq.observed_batches() == 1);  // not observed again by the recomputation
  });

  auto mixed = folded_net();
  prepare_qat(*mixed);
  train_steps(*mixed, 1, {.micro_batch = 1, .precision = Precision::bf16}, 2);
  for_each_fake_quant(*mixed, [](const std::string&, FakeQuantLayer& fq) {
    if (fq.takes_int8_input()) CHECK(fq.observed_batches() == 2);  // 1 step x 2 micro-batches
  });
  mixed->eval();
  convert_qat(*mixed);
}

TEST_CASE("QAT errors: unfolded, prepared twice, used or converted before training, bad observer", "[quant][qat]") {
  Generator g(5);
  MobileNetV2 unfolded(tiny_net(), {.gen = &g});
  CHECK_THROWS_WITH(prepare_qat(unfolded), Catch::Contains("call fold_batch_norms first"));
  auto net = folded_net();
  CHECK_THROWS_WITH(prepare_qat(*net, {.observer = ObserverKind::percentile}),
                    Catch::Contains("observer 'percentile' is not supported during training"));
  prepare_qat(*net);
  CHECK_THROWS_WITH(prepare_qat(*net), Catch::Contains("already prepared or quantized"));
  net->eval();
  NoGradGuard ng;
  CHECK_THROWS_WITH((*net)(images(2, 1)), Catch::Contains("no training forward has been observed"));
  CHECK_THROWS_WITH(convert_qat(*net), Catch::Contains("saw no calibration batch"));
  auto plain = folded_net();
  CHECK_THROWS_WITH(convert_qat(*plain), Catch::Contains("no FakeQuantLayer"));
}
