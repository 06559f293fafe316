// Trainer: accumulated gradients equal the full batch's (batch-norm-free GPT), peak memory follows the
// micro-batch, auto-fit retries the same batch after an OutOfMemoryError and ends exactly where
// a run with the smaller micro-batch ends (buffers and dropout streams undone), the error paths
// (no auto-fit; micro-batch 1 too large), activation offload, fp16 loss scaling, bad flags.
#include <catch2/catch.hpp>

#include "autograd/checkpoint.h"
#include "core/allocator.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/trainer.h"
#include "test_helpers.h"

using namespace mg;

namespace {

GPTConfig tiny(double dropout = 0.0) {
  return {.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 16, .dropout = dropout};
}
// Large enough that a step's activations need segments of their own (several MiB).
GPTConfig budget_sized(double dropout = 0.0) {
  return {.vocab_size = 32, .context = 64, .n_layer = 2, .n_head = 4, .d_model = 64, .dropout = dropout};
}

Tensor tokens(Shape shape, uint64_t seed, Device d) {
  Generator g(seed);
  std::vector<int64_t> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(g.bits_at(i) % 32u);
  return from_vector(v, shape, TensorOptions{.dtype = DType::i64, .device = d});
}

struct Setup {
  Device dev;
  Generator init{5};
  GPT model;
  AdamW opt;
  Tensor idx, tgt;
  Setup(Device d, double dropout = 0.0, int64_t batch = 8, const GPTConfig& cfg = tiny())
      : dev(d), model(with_dropout(cfg, dropout), {.gen = &init, .device = d}),
        opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.0)),
        idx(tokens({batch, cfg.context}, 1, d)), tgt(tokens({batch, cfg.context}, 2, d)) {}
  static GPTConfig with_dropout(GPTConfig c, double p) {
    c.dropout = p;
    return c;
  }
  Trainer::MicroLoss loss_fn() {
    return [this](int64_t b, int64_t n) { return model.loss(narrow(idx, 0, b, n), narrow(tgt, 0, b, n)); };
  }
  std::vector<std::vector<double>> params() {
    std::vector<std::vector<double>> out;
    for (auto& [_, p] : model.named_parameters()) out.push_back(p.to_double_vector());
    return out;
  }
};

}  // namespace

TEST_CASE("accumulation gives the full batch's gradients within f32 tolerance") {
  // Plain SGD with lr 1 turns each parameter's change into its gradient, so comparing the two
  // updates compares the accumulated gradients directly. (An Adam update would divide by the
  // gradient's own size and blow up rounding noise where the exact gradient is 0, e.g. the key
  // part of c_attn's bias, which softmax ignores.)
  Setup full(kCPU), micro(kCPU);
  SGD sgd_full(full.model.named_parameters(), 1.0), sgd_micro(micro.model.named_parameters(), 1.0);
  Trainer t_full(full.model, sgd_full, {});
  Trainer t_micro(micro.model, sgd_micro, {.micro_batch = 3});  // 3 + 3 + 2: unequal shares
  const auto before = full.params();
  StepReport a = t_full.step(8, full.loss_fn());
  StepReport b = t_micro.step(8, micro.loss_fn());
  CHECK(a.micro_steps == 1);
  CHECK(b.micro_steps == 3);
  CHECK(b.micro_batch == 3);
  CHECK(b.loss == Approx(a.loss).epsilon(1e-6));
  const auto pa = full.params(), pb = micro.params();
  double largest = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> ga(pa[i].size()), gb(pb[i].size());
    for (size_t k = 0; k < ga.size(); ++k) {
      ga[k] = before[i][k] - pa[i][k];
      gb[k] = before[i][k] - pb[i][k];
      largest = std::max(largest, std::abs(ga[k]));
    }
    CHECK(test::all_close(gb, ga, 1e-4, 1e-6));
  }
  CHECK(largest > 1e-3);  // the gradients are not all zero
  for (auto& [_, p] : micro.model.named_parameters()) CHECK_FALSE(p.grad().defined());  // dropped
}

TEST_CASE("accumulation with ignored targets weights micro-batches by counted targets, not examples") {
  // B = 5 rows of 16 targets; rows 0 and 1 are mostly ignored (-100), so the micro-batches of 2 hold
  // very different numbers of counted targets. Weighting them by examples is ~10% off.
  Setup full(kCPU, 0.0, 5), micro(kCPU, 0.0, 5);
  for (Setup* s : {&full, &micro}) {
    int64_t* t = s->tgt.data<int64_t>();
    for (int64_t i = 0; i < 5 * 16; ++i)
      if ((i < 32 && i % 5 != 0) || i % 7 == 3) t[i] = GPT::kIgnoreIndex;
  }
  auto counted = [](Setup& s) {
    return [&s](int64_t b, int64_t n) {
      double c = 0;
      for (double v : narrow(s.tgt, 0, b, n).to_double_vector()) c += v != double(GPT::kIgnoreIndex);
      return c;
    };
  };
  SGD sgd_full(full.model.named_parameters(), 1.0), sgd_micro(micro.model.named_parameters(), 1.0);
  Trainer t_full(full.model, sgd_full, {});
  Trainer t_micro(micro.model, sgd_micro, {.micro_batch = 2});
  const auto before = full.params();
  StepReport a = t_full.step(5, full.loss_fn(), counted(full));
  StepReport b = t_micro.step(5, micro.loss_fn(), counted(micro));
  CHECK(b.micro_steps == 3);
  CHECK(b.loss == Approx(a.loss).epsilon(1e-6));
  const auto pa = full.params(), pb = micro.params();
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> ga(pa[i].size()), gb(pb[i].size());
    for (size_t k = 0; k < ga.size(); ++k) {
      ga[k] = before[i][k] - pa[i][k];
      gb[k] = before[i][k] - pb[i][k];
    }
    CHECK(test::all_close(gb, ga, 1e-4, 1e-6));
  }
  // Without the weights (one per example) the same accumulation is measurably wrong.
  Setup wrong(kCPU, 0.0, 5);
  wrong.tgt = micro.tgt;
  SGD sgd_wrong(wrong.model.named_parameters(), 1.0);
  Trainer t_wrong(wrong.model, sgd_wrong, {.micro_batch = 2});
  StepReport c = t_wrong.step(5, wrong.loss_fn());
  CHECK(std::abs(c.loss - a.loss) > 1e-3 * std::abs(a.loss));
}

TEST_CASE("the optimizer state exists before the first forward, so auto-fit settles in the first step", "[slow]") {
  const Device dev{DeviceType::cpu, 10};
  // run(micro, limit, steps): a fresh model trained `steps` steps under the budget; the micro-batch
  // after each step and the final parameters.
  auto run = [&](int64_t micro, size_t limit, int steps) {
    Setup s(dev, 0.0, 8, budget_sized());
    empty_cache(dev);
    reset_peak_stats(dev);
    set_memory_limit(dev, limit);
    Trainer t(s.model, s.opt, {.micro_batch = micro, .auto_fit = true});
    std::vector<int64_t> micros;
    for (int i = 0; i < steps; ++i) {
      t.step(8, s.loss_fn());
      micros.push_back(t.micro_batch());
    }
    set_memory_limit(dev, 0);
    return std::make_tuple(micros, memory_stats(dev).reserved.peak, s.params());
  };
  const int64_t p8 = std::get<1>(run(0, 0, 2)), p2 = std::get<1>(run(2, 0, 2));
  REQUIRE(p2 < p8);
  auto [micros, peak, params] = run(0, size_t((p2 + p8) / 2), 3);
  INFO("micro-batch after each step: " << micros[0] << " " << micros[1] << " " << micros[2]);
  CHECK(micros[0] < 8);
  CHECK(micros[1] == micros[0]);  // settled once, in step 1
  CHECK(micros[2] == micros[0]);
  // Bit-identical to a run with the final micro-batch from the start.
  auto [ref_micros, ref_peak, ref_params] = run(micros[0], 0, 3);
  CHECK(ref_params == params);
}

TEST_CASE("peak activation memory follows the micro-batch, not the batch") {
  auto peak = [](int64_t micro) {
    const Device dev{DeviceType::cpu, 6};
    Setup s(dev, 0.0, 8);
    Trainer t(s.model, s.opt, {.micro_batch = micro});
    reset_peak_stats(dev);
    t.step(8, s.loss_fn());
    return memory_stats(dev).category(MemoryCategory::activation).peak;
  };
  const int64_t full = peak(0), quarter = peak(2);
  INFO("activation peak: batch 8 " << full << " B, micro-batch 2 " << quarter << " B");
  CHECK(quarter * 3 < full);
}

// Budgets limit reserved memory (segments held from the backend, as in PyTorch), so the tests
// place them by reserved peaks measured in the same pool.
TEST_CASE("auto-fit halves the micro-batch after an OutOfMemoryError and retries the same batch exactly") {
  const Device dev{DeviceType::cpu, 7};
  // fit(micro, limit): two steps of a fresh model (the second under the budget, with auto-fit
  // starting from `micro`); the second step's report, reserved peak, parameters, dropout offset.
  auto fit = [&](int64_t first_micro, int64_t micro, size_t limit) {
    Setup s(dev, 0.1, 8, budget_sized());
    default_generator().manual_seed(3);
    Trainer first(s.model, s.opt, {.micro_batch = first_micro});
    first.step(8, s.loss_fn());  // optimizer state now exists
    Trainer t(s.model, s.opt, {.micro_batch = micro, .auto_fit = true});
    empty_cache(dev);
    reset_peak_stats(dev);
    set_memory_limit(dev, limit);
    StepReport r = t.step(8, s.loss_fn());
    set_memory_limit(dev, 0);
    return std::make_tuple(r, memory_stats(dev).reserved.peak, s.params(), default_generator().offset(),
                           t.micro_batch());
  };
  const int64_t p8 = std::get<1>(fit(2, 0, 0)), p2 = std::get<1>(fit(2, 2, 0));
  REQUIRE(p2 < p8);
  auto [r, peak, params, offset, kept] = fit(2, 0, size_t((p2 + p8) / 2));
  CHECK(r.retries >= 1);
  CHECK(r.micro_batch < 8);
  CHECK(kept == r.micro_batch);  // kept for the next steps
  // The same two steps with that micro-batch from the start and no budget: bit for bit equal, so
  // no partial gradient survived the failed attempts and the dropout streams were rewound.
  auto [r_ref, peak_ref, params_ref, offset_ref, kept_ref] = fit(2, r.micro_batch, 0);
  CHECK(r_ref.retries == 0);
  CHECK(r.loss == r_ref.loss);
  CHECK(offset == offset_ref);
  CHECK(params == params_ref);
}

TEST_CASE("out of memory: without auto-fit the error propagates and nothing changes, micro-batch 1 too big stops") {
  const Device dev{DeviceType::cpu, 8};
  // One example's MLP hidden activation (1, 256, 4 x 256) f32 is 1 MiB: a large-pool block that
  // needs a segment of its own, so even micro-batch 1 cannot fit under a budget that allows no new one.
  const GPTConfig long_context{.vocab_size = 32, .context = 256, .n_layer = 1, .n_head = 4, .d_model = 256};
  Setup s(dev, 0.0, 2, long_context);
  Trainer warm(s.model, s.opt, {});
  warm.step(2, s.loss_fn());
  const auto before = s.params();
  empty_cache(dev);
  set_memory_limit(dev, size_t(memory_stats(dev).reserved.current));  // no new segment fits
  Trainer plain(s.model, s.opt, {});
  CHECK_THROWS_AS(plain.step(2, s.loss_fn()), OutOfMemoryError);
  CHECK(s.params() == before);
  for (auto& [_, p] : s.model.named_parameters()) CHECK_FALSE(p.grad().defined());
  Trainer fit(s.model, s.opt, {.auto_fit = true});
  CHECK_THROWS_WITH(fit.step(2, s.loss_fn()), Catch::Contains("even a micro-batch of 1 example does not fit"));
  CHECK(s.params() == before);
  set_memory_limit(dev, 0);
}

TEST_CASE("auto-fit puts batch-norm running statistics back before retrying") {
  const Device dev{DeviceType::cpu, 9};
  MobileNetV2Config cfg{.width_mult = 0.25, .num_classes = 4, .small_input = true, .dropout = 0.0, .input_size = 16};
  Tensor x = test::rand_tensor({8, 3, 16, 16}, 3, DType::f32);
  Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}, {8}, TensorOptions{.dtype = DType::i64});
  // run(micro, limit): one step of a fresh model; its report, reserved peak and final state.
  auto run = [&](int64_t micro, size_t limit) {
    Generator init(2);
    MobileNetV2 model(cfg, {.gen = &init, .device = dev});
    SGD opt(weight_decay_groups(model.named_parameters(), 0.1, 0.0));
    Tensor xd = to(x, dev), yd = to(y, dev);
    Trainer t(model, opt, {.micro_batch = micro, .auto_fit = true});
    auto fn = [&](int64_t b, int64_t n) { return cross_entropy(model.forward(narrow(xd, 0, b, n)), narrow(yd, 0, b, n)); };
    empty_cache(dev);
    reset_peak_stats(dev);
    set_memory_limit(dev, limit);
    StepReport r = t.step(8, fn);
    set_memory_limit(dev, 0);
    const int64_t peak = memory_stats(dev).reserved.peak;
    std::vector<std::vector<double>> state;
    for (auto& [_, b] : model.named_buffers()) state.push_back(b.to_double_vector());
    for (auto& [_, p] : model.named_parameters()) state.push_back(p.to_double_vector());
    return std::make_tuple(r, state, peak);
  };
  const int64_t p8 = std::get<2>(run(0, 0)), p2 = std::get<2>(run(2, 0));
  REQUIRE(p2 < p8);
  auto [r_fit, s_fit, peak_fit] = run(0, size_t((p2 + p8) / 2));
  REQUIRE(r_fit.retries >= 1);
  auto [r_ref, s_ref, peak_ref] = run(r_fit.micro_batch, 0);
  CHECK(s_fit == s_ref);  // running stats (and weights) moved by the successful attempt only
}

TEST_CASE("activation offload moves saved activations off the training device with identical gradients") {
  auto run = [](std::optional<Device> offload) {
    const Device dev{DeviceType::cpu, 10};
    Setup s(dev);
    Trainer t(s.model, s.opt, {.offload_activations = offload});
    reset_peak_stats(dev);
    StepReport r = t.step(8, s.loss_fn());
    return std::make_tuple(memory_stats(dev).category(MemoryCategory::activation).peak, s.params(), r);
  };
  auto [peak_plain, params_plain, r_plain] = run(std::nullopt);
  auto [peak_off, params_off, r_off] = run(Device{DeviceType::cpu, 11});
  INFO("activation peak on cpu:10: " << peak_plain << " B without offload, " << peak_off << " B with");
  CHECK(r_off.offloaded_bytes > 0);
  CHECK(r_plain.offloaded_bytes == 0);
  CHECK(peak_off < peak_plain);
  CHECK(params_off == params_plain);
}

TEST_CASE("fp16 training through the Trainer skips an overflowed step and backs off the scale") {
  Setup s(kCPU);
  Trainer t(s.model, s.opt, {.precision = Precision::fp16, .scaler = {.init_scale = std::ldexp(1.0, 40)}});
  const auto before = s.params();
  StepReport r = t.step(8, s.loss_fn());
  CHECK_FALSE(r.stepped);
  CHECK(s.params() == before);
  CHECK(t.scaler()->scale_value() < std::ldexp(1.0, 40));
  for (int i = 0; i < 80 && !r.stepped; ++i) r = t.step(8, s.loss_fn());
  CHECK(r.stepped);
  for (auto& [_, p] : s.model.named_parameters())
    for (double v : p.to_double_vector()) REQUIRE(std::isfinite(v));
  nlohmann::json st = t.state();
  CHECK(st.contains("scaler"));
  Trainer t2(s.model, s.opt, {.precision = Precision::fp16});
  t2.load_state(st);
  CHECK(t2.scaler()->scale_value() == t.scaler()->scale_value());
}

TEST_CASE("Trainer options and precision names are checked") {
  CHECK(parse_precision("bf16-pure") == Precision::bf16_pure);
  CHECK(precision_name(Precision::fp16) == "fp16");
  CHECK_THROWS_WITH(parse_precision("int8"), Catch::Contains("unknown precision 'int8'"));
  Setup s(kCPU);
  CHECK_THROWS_WITH(Trainer(s.model, s.opt, {.micro_batch = -1}), Catch::Contains("micro_batch must be >= 0"));
  Trainer t(s.model, s.opt, {});
  CHECK_THROWS_WITH(t.load_state(nlohmann::json{{"micro_batch", "x"}}), Catch::Contains("micro_batch"));
}
