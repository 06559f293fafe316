// Quantization-aware training (models/compress/qat.h): prepare_qat wraps the right layers, the
// Trainer trains them (observers move once per training forward, frozen in eval and in checkpoint
// recomputation: checkpointed gradients stay bit-identical), autocast and accumulation run, the
// converted int8 model computes what the fake-quant model computed, and the errors are clear.
// Learned scales (LSQ): initialised from the observed values, trained alone they lower the loss,
// checkpointed gradients stay bit-identical, a negative scale is clamped, the int8 model uses them
// and computes what the fake-quant model computed, and they round-trip through a saved state.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/safetensors.h"
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

// The largest |a - b| and |a| of two logit tensors.
std::pair<double, double> max_diff(const Tensor& x, const Tensor& y) {
  const auto a = x.to_vector<float>(), b = y.to_vector<float>();
  double big = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) big = std::max(big, std::abs(double(a[i]))), diff = std::max(diff, std::abs(double(a[i] - b[i])));
  return {diff, big};
}

Tensor weight_of(const FakeQuantLayer& fq) {
  if (auto* c = dynamic_cast<Conv2d*>(fq.inner.get())) return c->weight;
  return dynamic_cast<Linear*>(fq.inner.get())->weight;
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

// One training backward of a prepared net with and without block checkpointing: every gradient
// (learned scales' included) must be bit-identical. Returns the checkpointed net.
std::shared_ptr<MobileNetV2> check_checkpointed_gradients(QatOptions opt) {
  auto plain = folded_net(), ckpt = folded_net();
  prepare_qat(*plain, opt);
  prepare_qat(*ckpt, opt);
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
  return ckpt;
}

}  // namespace

TEST_CASE("QAT: prepare, train with the Trainer, convert, int8 output equals the fake-quant output", "[quant][qat]") {
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
  const auto [diff, big] = max_diff(y_fake, y_int8);
  UNSCOPED_INFO("int8 vs fake-quant: max diff " << diff << ", largest logit " << big);
  CHECK(diff <= 1e-3 * big);
  CHECK(argmax(y_fake, 1).to_vector<int64_t>() == argmax(y_int8, 1).to_vector<int64_t>());
  CHECK_THROWS_WITH(convert_qat(*net), Catch::Contains("no FakeQuantLayer"));
}

TEST_CASE("QAT with checkpointing (bit-identical gradients), autocast and accumulation", "[quant][qat]") {
  auto ckpt = check_checkpointed_gradients({});
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

TEST_CASE("QAT learned scales: initialised as observed, the observer stops after the first batch", "[quant][qat]") {
  auto net = folded_net();
  prepare_qat(*net, {.scales = QatScales::learned});
  int64_t layers = 0, inputs = 0, scales = 0;
  for (auto& [name, p] : net->named_parameters()) scales += name.ends_with("weight_scale") || name.ends_with("input_scale");
  for_each_fake_quant(*net, [&](const std::string& name, FakeQuantLayer& fq) {
    INFO(name);
    ++layers;
    inputs += fq.takes_int8_input();
    CHECK(fq.weight_scale.to_vector<float>() == per_channel_scales(weight_of(fq)).to_vector<float>());
    CHECK(fq.input_scale.defined() == fq.takes_int8_input());
  });
  CHECK(scales == layers + inputs);  // Parameters: the optimizer and state_dict carry them
  std::vector<std::vector<float>> initial;
  for_each_fake_quant(*net, [&](const std::string&, FakeQuantLayer& fq) { initial.push_back(fq.weight_scale.to_vector<float>()); });
  train_steps(*net, 2, {}, 2);
  size_t i = 0;
  for_each_fake_quant(*net, [&](const std::string& name, FakeQuantLayer& fq) {
    INFO(name);
    CHECK(fq.weight_scale.to_vector<float>() != initial[i++]);  // the Trainer's optimizer moved them
    if (fq.takes_int8_input()) CHECK(fq.observed_batches() == 1);  // the first batch only: it fixed the zero point
  });
  // the first training forward sets each input scale from the observer's first range
  auto fresh = folded_net();
  prepare_qat(*fresh, {.scales = QatScales::learned});
  fresh->train();
  (*fresh)(images(2, 100));
  for_each_fake_quant(*fresh, [&](const std::string& name, FakeQuantLayer& fq) {
    if (!fq.takes_int8_input()) return;
    INFO(name);
    CHECK(fq.input_scale.item<float>() == choose_qparams_u8(fq.input_lo.item<float>(), fq.input_hi.item<float>()).scale);
  });
}

TEST_CASE("QAT learned scales: trained alone, they lower the quantization error", "[quant][qat]") {
  // An MLP fake-quantized with every scale 3x coarser than observed, distilled towards its own float
  // outputs with only the scales trained (Adam, each scale's step ~3% of it): the LSQ gradient must
  // take them back down, the error must fall. (From the observed scales themselves the same steps
  // gain ~2%: at 8 bits min-max is close to the best scale for this MLP.)
  Generator g(8);
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Linear>(16, 32, true, InitOptions{.gen = &g}));
  net->push_back(std::make_shared<ReLU6>());
  net->push_back(std::make_shared<Linear>(32, 8, true, InitOptions{.gen = &g}));
  Tensor x = rand_tensor({64, 16}, 61, DType::f32, -1, 1);
  {
    NoGradGuard ng;
    x.data<float>()[5] = 12.f, x.data<float>()[300] = -9.f;  // two outliers
  }
  Tensor target;
  {
    NoGradGuard ng;
    target = (*net)(x);
  }
  prepare_qat(*net, {.scales = QatScales::learned});
  net->train();
  NamedTensors scales;
  for (auto& [name, p] : net->named_parameters())
    if (name.ends_with("_scale")) scales.emplace_back(name, p);
  REQUIRE(scales.size() == 4);
  {
    NoGradGuard ng;
    (*net)(x);  // sets the input scales from the observer
    for (auto& [n, p] : scales) copy_(p, mul(p, 3.0));
  }
  std::vector<std::vector<float>> before;
  for (auto& [n, p] : scales) before.push_back(p.to_vector<float>());
  std::vector<ParamGroup> groups;  // Adam steps ~lr: each scale's lr in proportion to its size
  for (auto& [n, p] : scales) groups.push_back({.name = n, .params = {{n, p}}, .lr = 0.03 * p.to_vector<float>()[0]});
  AdamW opt(std::move(groups));
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    Tensor l = mse_loss((*net)(x), target);
    (step == 0 ? first : last) = l.item();
    backward(l);
    opt.step();
  }
  UNSCOPED_INFO("quantization error (mse vs float) " << first << " -> " << last);
  CHECK(last < 0.5 * first);  // measured: 2.25e-4 -> 4.7e-5 (the observed scales give 2.5e-5)
  for (size_t i = 0; i < scales.size(); ++i) {
    const auto now = scales[i].second.to_vector<float>();
    double sum_now = 0, sum_before = 0;
    for (size_t c = 0; c < now.size(); ++c) sum_now += now[c], sum_before += before[i][c];
    INFO(scales[i].first);
    CHECK(sum_now < 0.9 * sum_before);  // every scale went down, towards the observed one
  }
}

TEST_CASE("QAT learned scales: Trainer, checkpointing, clamping, convert equality, saved state", "[quant][qat]") {
  check_checkpointed_gradients({.scales = QatScales::learned});

  auto net = folded_net();
  prepare_qat(*net, {.scales = QatScales::learned});
  train_steps(*net, 3, {.micro_batch = 1}, 2);
  // a scale the optimizer took below zero is clamped before the next forward, not an error
  FakeQuantLayer* first = nullptr;
  for_each_fake_quant(*net, [&](const std::string&, FakeQuantLayer& fq) {
    if (!first && fq.takes_int8_input()) first = &fq;
  });
  REQUIRE(first);
  {
    NoGradGuard ng;
    first->weight_scale.data<float>()[0] = -0.01f;
  }
  net->eval();
  NoGradGuard ng;
  Tensor xe = images(6, 7);
  Tensor y_fake = (*net)(xe);
  CHECK(first->weight_scale.to_vector<float>()[0] == FakeQuantLayer::kMinScale);

  // the saved state (scales are parameters) loads into a freshly prepared model: same outputs
  const std::string file = (std::filesystem::temp_directory_path() / "mg_test_qat_learned.safetensors").string();
  save_safetensors(file, net->state_dict());
  auto again = folded_net();
  prepare_qat(*again, {.scales = QatScales::learned});
  again->load_state_dict(load_safetensors(file));
  std::filesystem::remove(file);
  again->eval();
  CHECK((*again)(xe).to_vector<float>() == y_fake.to_vector<float>());

  // convert: the int8 layers hold the learned scales (not max|w_c| / 127) and compute the same logits
  std::vector<std::vector<float>> learned_w, learned_in;
  int64_t differ = 0;
  for_each_fake_quant(*net, [&](const std::string&, FakeQuantLayer& fq) {
    learned_w.push_back(fq.weight_scale.to_vector<float>());
    if (fq.takes_int8_input()) learned_in.push_back({fq.input_scale.item<float>()});
    differ += learned_w.back() != per_channel_scales(weight_of(fq)).to_vector<float>();
  });
  CHECK(differ == int64_t(learned_w.size()));  // training moved every layer's scales off the observed ones
  convert_qat(*net);
  std::vector<std::vector<float>> int8_w, int8_in;
  for (auto& [name, m] : net->named_modules()) {
    if (auto* c = dynamic_cast<Int8ConvBase*>(m)) int8_w.push_back(c->weight_scale.to_vector<float>()), int8_in.push_back({c->input.scale.item<float>()});
    else if (auto* l = dynamic_cast<Int8Linear*>(m)) int8_w.push_back(l->weight_scale.to_vector<float>()), int8_in.push_back({l->input.scale.item<float>()});
    else if (auto* o = dynamic_cast<Int8WeightOnlyConv2d*>(m)) int8_w.push_back(o->weight_scale.to_vector<float>());
  }
  std::sort(learned_w.begin(), learned_w.end());
  std::sort(int8_w.begin(), int8_w.end());
  std::sort(learned_in.begin(), learned_in.end());
  std::sort(int8_in.begin(), int8_in.end());
  CHECK(int8_w == learned_w);
  CHECK(int8_in == learned_in);
  Tensor y_int8 = (*net)(xe);
  // the tolerance of the observed-scale test above (int32 vs f32 summation order only)
  const auto [diff, big] = max_diff(y_fake, y_int8);
  UNSCOPED_INFO("learned scales, int8 vs fake-quant: max diff " << diff << ", largest logit " << big);
  CHECK(diff <= 1e-3 * big);
  CHECK(argmax(y_fake, 1).to_vector<int64_t>() == argmax(y_int8, 1).to_vector<int64_t>());
}

TEST_CASE("QAT scales: names", "[quant][qat]") {
  CHECK(parse_qat_scales("learned") == QatScales::learned);
  CHECK(std::string(qat_scales_name(QatScales::observed)) == "observed");
  CHECK_THROWS_WITH(parse_qat_scales("lsq"), Catch::Contains("unknown QAT scales 'lsq' (known: observed, learned)"));
}
