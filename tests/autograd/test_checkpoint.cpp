// Activation checkpointing: gradients bit-identical to the un-checkpointed ones under every
// policy (GPT with dropout, so the masks must replay; MobileNetV2, whose batch norm must update
// its running statistics once), the activation peak falling, the random streams left where an
// uncheckpointed run leaves them, nested segments, eval mode, policy parsing.
#include <catch2/catch.hpp>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;

namespace {

GPTConfig small_gpt() {
  return {.vocab_size = 40, .context = 16, .n_layer = 4, .n_head = 2, .d_model = 16, .dropout = 0.1};
}

Tensor random_tokens(Shape shape, int64_t vocab, uint64_t seed, Device d = kCPU) {
  Generator g(seed);
  std::vector<int64_t> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(g.bits_at(i) % uint32_t(vocab));
  return from_vector(v, shape, TensorOptions{.dtype = DType::i64, .device = d});
}

struct GptRun {
  double loss;
  std::map<std::string, std::vector<double>> grads;
  uint64_t offset_after;  // the dropout stream's position after forward + backward
};

GptRun gpt_step(const std::string& policy) {
  Generator init(7);
  GPT model(small_gpt(), {.gen = &init});
  model.set_checkpoint(CheckpointPolicy::parse(policy));
  default_generator().manual_seed(99);
  Tensor idx = random_tokens({2, 12}, 40, 1), tgt = random_tokens({2, 12}, 40, 2);
  Tensor loss = model.loss(idx, tgt);
  backward(loss);
  GptRun r{loss.item(), {}, default_generator().offset()};
  for (auto& [n, p] : model.named_parameters()) r.grads[n] = p.grad().to_double_vector();
  return r;
}

}  // namespace

TEST_CASE("checkpointed GPT gradients are bit-identical to the uncheckpointed ones, dropout included") {
  const GptRun ref = gpt_step("none");
  for (const char* policy : {"blocks", "every:2", "sqrt", "selective", "every:3"}) {
    INFO("policy " << policy);
    const GptRun r = gpt_step(policy);
    CHECK(r.loss == ref.loss);
    CHECK(r.offset_after == ref.offset_after);  // recomputation rewound and restored the stream
    REQUIRE(r.grads.size() == ref.grads.size());
    for (const auto& [name, g] : ref.grads) {
      INFO(name);
      CHECK(r.grads.at(name) == g);  // exact, element for element
    }
  }
}

TEST_CASE("checkpointing lowers the activation peak of a GPT step", "[slow]") {
  const Device dev{DeviceType::cpu, 5};  // a pool of its own
  auto peak_of = [&](const std::string& policy) {
    Generator init(3);
    GPTConfig cfg = small_gpt();
    cfg.n_layer = 6;
    cfg.context = 32;
    cfg.d_model = 32;
    GPT model(cfg, {.gen = &init, .device = dev});
    model.set_checkpoint(CheckpointPolicy::parse(policy));
    Tensor idx = random_tokens({4, 32}, 40, 1, dev), tgt = random_tokens({4, 32}, 40, 2, dev);
    reset_peak_stats(dev);
    Tensor loss = model.loss(idx, tgt);
    backward(loss);
    return memory_stats(dev).category(MemoryCategory::activation).peak;
  };
  const int64_t none = peak_of("none"), blocks = peak_of("blocks"), selective = peak_of("selective"),
                sqrt_ = peak_of("sqrt");
  INFO("activation peaks: none " << none << ", blocks " << blocks << ", selective " << selective << ", sqrt "
                                 << sqrt_);
  CHECK(blocks * 2 < none);
  CHECK(selective < none);
  CHECK(sqrt_ < none);
}

TEST_CASE("checkpointed MobileNetV2: identical gradients and running statistics updated once") {
  MobileNetV2Config cfg{.width_mult = 0.25, .num_classes = 5, .small_input = true, .dropout = 0.0, .input_size = 8};
  auto run = [&](const std::string& policy) {
    Generator init(11);
    MobileNetV2 model(cfg, {.gen = &init});
    model.set_checkpoint(CheckpointPolicy::parse(policy));
    Tensor x = rand_tensor({3, 3, 8, 8}, 5, DType::f32);
    Tensor y = from_vector(std::vector<int64_t>{0, 3, 4}, {3}, TensorOptions{.dtype = DType::i64});
    Tensor loss = cross_entropy(model.forward(x), y);
    backward(loss);
    std::map<std::string, std::vector<double>> out;
    for (auto& [n, p] : model.named_parameters()) out[n] = p.grad().to_double_vector();
    for (auto& [n, b] : model.named_buffers()) out["buffer:" + n] = b.to_double_vector();
    out["loss"] = {loss.item()};
    return out;
  };
  const auto ref = run("none");
  for (const char* policy : {"blocks", "sqrt", "selective"}) {
    INFO("policy " << policy);
    const auto r = run(policy);
    REQUIRE(r.size() == ref.size());
    for (const auto& [name, v] : ref) {
      INFO(name);
      CHECK(r.at(name) == v);  // num_batches_tracked stays 1, running means moved once
    }
  }
}

TEST_CASE("checkpoint: segments that return an input, several outputs, nesting, and eval mode") {
  Tensor a = leaf(rand_tensor({3, 4}, 1)), b = leaf(rand_tensor({3, 4}, 2));
  auto seg = [](const std::vector<Tensor>& in) {
    Tensor inner = checkpoint([](const Tensor& t) { return mul(t, t); }, in[0]);  // nested segment
    return std::vector<Tensor>{add(inner, in[1]), in[1]};  // the second output is an input
  };
  std::vector<Tensor> out = checkpoint(SegmentFn(seg), {a, b});
  REQUIRE(out.size() == 2);
  CHECK(b.grad_fn() == nullptr);  // the input kept its own (leaf) history
  backward(add(sum(out[0]), sum(mul(out[1], out[1]))));
  // d/da sum(a^2) = 2a; d/db [sum(b) + sum(b^2)] = 1 + 2b
  check_close(a.grad(), mul(a, 2.0));
  check_close(b.grad(), add(mul(b, 2.0), 1.0));

  NoGradGuard no_grad;
  Tensor y = checkpoint([](const Tensor& t) { return mul(t, 3.0); }, a);
  CHECK_FALSE(y.requires_grad());
}

TEST_CASE("checkpoint policies parse and name their segments") {
  CHECK(CheckpointPolicy::parse("none").segments(4).empty());
  CHECK(CheckpointPolicy::parse("selective").segments(4).empty());
  CHECK(CheckpointPolicy::parse("blocks").segments(3) == std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 3}});
  CHECK(CheckpointPolicy::parse("every:2").segments(5) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {2, 3}, {4, 5}});
  CHECK(CheckpointPolicy::parse("sqrt").segments(8) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 8}});
  CHECK(CheckpointPolicy::parse("every:3").str() == "every:3");
  CHECK_THROWS_WITH(CheckpointPolicy::parse("every:0"), Catch::Contains("every:K"));
  CHECK_THROWS_WITH(CheckpointPolicy::parse("every:x"), Catch::Contains("every:K"));
  CHECK_THROWS_WITH(CheckpointPolicy::parse("layers"), Catch::Contains("checkpoint policy 'layers' is unknown"));
}

TEST_CASE("checkpoint_sequential: segments recompute once in backward, gradients bit-identical, blocks may be a temporary") {
  struct Run {
    std::vector<double> dx, dw;
    int calls;
  };
  auto run = [](const std::string& policy) {
    Tensor x = leaf(rand_tensor({3, 4}, 1));
    std::vector<Tensor> w;
    for (int i = 0; i < 5; ++i) w.push_back(leaf(rand_tensor({4, 4}, uint64_t(10 + i))));
    auto calls = std::make_shared<int>(0);
    Tensor y;
    {
      std::vector<BlockFn> blocks;  // destroyed before backward: the segments keep their copies
      for (int i = 0; i < 5; ++i)
        blocks.push_back([wi = w[size_t(i)], calls](const Tensor& t) {
          ++*calls;
          return tanh(matmul(t, wi));  // (3, 4)
        });
      y = checkpoint_sequential(blocks, CheckpointPolicy::parse(policy), x);
    }
    backward(sum(mul(y, y)));
    Run r{x.grad().to_double_vector(), {}, *calls};
    for (const Tensor& wi : w)
      for (double v : wi.grad().to_double_vector()) r.dw.push_back(v);
    return r;
  };
  const Run ref = run("none");
  CHECK(ref.calls == 5);
  // 5 blocks: blocks and sqrt (segments [0,3) [3,5)) recompute all 5, every:2 blocks 0, 2 and 4.
  for (const auto& [policy, calls] : std::vector<std::pair<std::string, int>>{
           {"blocks", 10}, {"sqrt", 10}, {"every:2", 8}, {"every:5", 6}, {"selective", 5}}) {
    INFO("policy " << policy);
    const Run r = run(policy);
    CHECK(r.calls == calls);
    CHECK(r.dx == ref.dx);  // bit-identical
    CHECK(r.dw == ref.dw);
  }
  // An empty chain is the identity.
  Tensor x = rand_tensor({2}, 3);
  CHECK(checkpoint_sequential({}, CheckpointPolicy::parse("blocks"), x).data_ptr() == x.data_ptr());
}

TEST_CASE("checkpoint policy errors name the policy, not a command-line flag") {
  for (const char* bad : {"layers", "every:0", "every:", "every:2x"}) {
    INFO(bad);
    CHECK_THROWS_WITH(CheckpointPolicy::parse(bad), Catch::Contains(std::string("checkpoint policy '") + bad + "'") &&
                                                        !Catch::Contains("--"));
  }
}
