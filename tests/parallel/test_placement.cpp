// Placement: the map syntax (ranges, round trip, errors), the checks against a model (unknown,
// unplaceable, doubly placed and unplaced modules, missing devices), and that a placed GPT or
// MobileNetV2 computes the same loss and the same bits in every gradient as on one device.
#include <catch2/catch.hpp>

#include "autograd/grad_mode.h"
#include "core/cuda/backend.h"
#include "optim/adam.h"
#include "optim/trainer.h"
#include "parallel/placement.h"
#include "parallel/split.h"
#include "parallel_test_util.h"

using namespace mg;

TEST_CASE("placement: parses ranges and prints them folded", "[parallel]") {
  Placement p = Placement::parse(" wte,wpe,h.0-1 = cpu:0; h.2-3,ln_f=cpu:1 ");
  REQUIRE(p.entries.size() == 7);
  CHECK(p.entries[2].first == "h.0");
  CHECK(p.entries[3] == std::make_pair(std::string("h.1"), Device("cpu:0")));
  CHECK(p.entries[6] == std::make_pair(std::string("ln_f"), Device("cpu:1")));
  CHECK(p.str() == "wte,wpe,h.0-1=cpu:0;h.2-3,ln_f=cpu:1");
  CHECK(p.devices() == std::vector<Device>{Device("cpu:0"), Device("cpu:1")});
  // A range inside a path expands too, and folds back.
  Placement q = Placement::parse("h.0-2.attn=cpu:1;h.0-2.mlp,h.4=cpu:2");
  CHECK(q.entries.size() == 7);
  CHECK(q.entries[1].first == "h.1.attn");
  CHECK(q.str() == "h.0-2.attn=cpu:1;h.0-2.mlp,h.4=cpu:2");
  CHECK(fold_paths({"h.3", "h.1", "h.2", "ln_f", "h.7"}) == "h.1-3,h.7,ln_f");
}

TEST_CASE("placement: bad map strings name the problem", "[parallel]") {
  CHECK_THROWS_WITH(Placement::parse("wte,wpe"), Catch::Contains("group 1 'wte,wpe' has no '=device'"));
  CHECK_THROWS_WITH(Placement::parse("h.3-1=cpu:0"), Catch::Contains("bad range '3-1'"));
  CHECK_THROWS_WITH(Placement::parse("h.a-2=cpu:0"), Catch::Contains("bad range 'a-2'"));
  CHECK_THROWS_WITH(Placement::parse("wte=gpu:0"), Catch::Contains("bad device 'gpu:0'"));
  CHECK_THROWS_WITH(Placement::parse("h.0-2=cpu:0;h.2=cpu:1"), Catch::Contains("'h.2' is placed twice (cpu:0 and cpu:1)"));
  CHECK_THROWS_WITH(Placement::parse("=cpu:0"), Catch::Contains("names no module"));
  CHECK_THROWS_WITH(Placement::parse("wte,,wpe=cpu:0"), Catch::Contains("empty module path"));
}

TEST_CASE("placement: checks against the model list every problem", "[parallel]") {
  auto gpt = test::tiny_gpt(kMeta);
  auto message = [&](const std::string& spec) {
    try {
      resolve_placement(*gpt, Placement::parse(spec));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string m = message("wte,wpe,h.0-1,h.9=cpu:0;h.1.attn,h.2.attn.c_attn,h.3=cpu:1");
  CHECK_THAT(m, Catch::Contains("unknown module path 'h.9'"));
  CHECK_THAT(m, Catch::Contains("'h.2.attn.c_attn' cannot be placed on its own"));
  CHECK_THAT(m, Catch::Contains("'h.1.attn' is placed twice: by 'h.1=cpu:0' and by 'h.1.attn=cpu:1'"));
  CHECK_THAT(m, Catch::Contains("not placed: h.2.ln_1,h.2.attn,h.2.ln_2,h.2.mlp,ln_f"));
  CHECK_THAT(m, Catch::Contains("placeable modules: wte, wpe, h, h.N"));
  if (cuda::device_count() < 8)
    CHECK_THAT(message("wte,wpe,h=cpu:0;ln_f=cuda:7"), Catch::Contains("device cuda:7 does not exist"));
  CHECK(message("wte,wpe,h=cpu:0;ln_f=cpu:1") == "(no error)");
  // Nothing moved after a failed check.
  for (const auto& [n, p] : gpt->named_parameters()) CHECK(p.device() == kMeta);
  // Not a known model.
  Linear lin(2, 2);
  CHECK_THROWS_WITH(resolve_placement(lin, Placement::parse("weight=cpu:0")), Catch::Contains("a Linear has no placement layout"));
}

TEST_CASE("placement: attention-mlp gives the single-device loss and gradients bit for bit", "[parallel]") {
  const Device a("cpu:3"), b("cpu:4");
  auto ref = test::tiny_gpt(a);
  const test::StepResult want = test::gpt_step(*ref);

  auto gpt = test::tiny_gpt(a);
  const ResolvedPlacement r = apply_placement(*gpt, attention_mlp_placement(model_layout(*gpt), {a, b}));
  CHECK(r.modules_on(a) == "wte,wpe,h.0-3.ln_1,h.0-3.attn");
  CHECK(r.modules_on(b) == "h.0-3.ln_2,h.0-3.mlp,ln_f");
  CHECK((r.input_device() == a && r.output_device() == a));  // the head is the tied wte
  CHECK(gpt->h->at<Block>(2)->attn->c_attn->weight.device() == a);
  CHECK(gpt->h->at<Block>(2)->mlp->c_fc->weight.device() == b);
  CHECK(gpt->ln_f->weight.device() == b);
  test::check_identical(test::gpt_step(*gpt), want);
  CHECK_THROWS_WITH(gpt->generate({1, 2}, 2), Catch::Contains("the model is split over devices"));
}

TEST_CASE("placement: stages and a leaf-by-leaf alternation equal one device, the optimizer steps each device", "[parallel]") {
  const Device a("cpu:3"), b("cpu:4"), c("cpu:5");
  auto ref = test::tiny_gpt(a);
  const test::StepResult want = test::gpt_step(*ref);
  AdamW ref_opt(weight_decay_groups(ref->named_parameters(), 1e-2, 0.01));
  ref_opt.step();

  SECTION("stages over three devices") {
    auto gpt = test::tiny_gpt(a);
    const ResolvedPlacement r = apply_placement(*gpt, stages_placement(model_layout(*gpt), {a, b, c}, {2, 1, 1}));
    CHECK(r.modules_on(b) == "h.2");
    test::check_identical(test::gpt_step(*gpt), want);
    AdamW opt(weight_decay_groups(gpt->named_parameters(), 1e-2, 0.01));
    opt.step();
    const auto ref_params = ref->named_parameters();
    const auto params = gpt->named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO(params[i].first);
      const ParamState* s = opt.state(params[i].first);
      REQUIRE(s != nullptr);
      CHECK(s->tensors[0].second.device() == params[i].second.device());  // state lives with its parameter
      CHECK(to(params[i].second, kCPU).to_double_vector() == ref_params[i].second.to_double_vector());
    }
  }
  SECTION("every leaf on the other device than the one before it") {
    auto gpt = test::tiny_gpt(a);
    Placement p;
    const ModelLayout layout = model_layout(*gpt);
    for (size_t i = 0; i < layout.leaves.size(); ++i) p.entries.emplace_back(layout.leaves[i], i % 2 ? b : a);
    apply_placement(*gpt, p);
    test::check_identical(test::gpt_step(*gpt), want);
  }
  SECTION("under activation checkpointing") {
    auto gpt = test::tiny_gpt(a);
    apply_placement(*gpt, Placement::parse("wte,wpe,h.0=cpu:3;h.1-3,ln_f=cpu:4"));
    gpt->set_checkpoint(CheckpointPolicy::parse("sqrt"));  // segment h.0-1 crosses the devices
    test::check_identical(test::gpt_step(*gpt), want);
  }
}

TEST_CASE("placement: MobileNetV2 in stages equals one device (loss, gradients, batch-norm statistics)", "[parallel]") {
  const Device a("cpu:3"), b("cpu:4");
  const MobileNetV2Config cfg{.width_mult = 0.25, .num_classes = 5, .small_input = true, .dropout = 0.2, .input_size = 16};
  auto build = [&]() {
    Generator gen(3);
    return std::make_shared<MobileNetV2>(cfg, InitOptions{.gen = &gen, .device = a});
  };
  auto run = [&](MobileNetV2& net) {
    Tensor x = test::rand_tensor({3, 3, 16, 16}, 5, DType::f32, -1, 1, a);
    manual_seed(99);
    Tensor logits = net(x);
    Tensor labels = from_vector(std::vector<int64_t>{0, 3, 4}, {3}, TensorOptions{.dtype = DType::i64, .device = logits.device()});
    Tensor loss = cross_entropy(logits, labels);
    backward(loss);
    return test::collect(net, loss);
  };
  auto ref = build();
  const test::StepResult want = run(*ref);
  auto net = build();
  const ModelLayout layout = model_layout(*net);
  CHECK(layout.blocks.size() == 17);
  const ResolvedPlacement r = apply_placement(*net, stages_placement(layout, {a, b}, equal_counts(17, 2)));
  CHECK(r.modules_on(a) == "features.0-9");
  CHECK((r.input_device() == a && r.output_device() == b));
  CHECK(r.modules_on(b) == "features.10-18,classifier");
  test::check_identical(run(*net), want);
  const auto ref_buffers = ref->named_buffers();
  const auto buffers = net->named_buffers();
  for (size_t i = 0; i < buffers.size(); ++i)
    CHECK(to(buffers[i].second, kCPU).to_double_vector() == ref_buffers[i].second.to_double_vector());

  // balanced: cut points from the per-device peaks on meta (early blocks hold most activations,
  // late ones most parameters), the same bits again.
  const BalancedPlan plan = plan_balanced(mobilenet_step_probe(cfg, 3, 16), {a, b});
  INFO(plan.str());
  CHECK(plan.counts[0] + plan.counts[1] == 17);
  auto balanced = build();
  apply_placement(*balanced, plan.placement);
  test::check_identical(run(*balanced), want);
}

TEST_CASE("placement: the Trainer steps a split GPT like a single-device one", "[parallel]") {
  // Micro-batching, clipping and AdamW through optim/Trainer, unchanged: the micro losses read
  // their tokens on the placement's input device.
  const Device a("cpu:3"), b("cpu:4");
  auto run = [&](bool split) {
    auto gpt = test::tiny_gpt(a);
    Device in = a;
    if (split) in = apply_placement(*gpt, Placement::parse("wte,wpe,h.0-2.attn,h.0-2.ln_1=cpu:3;h.0-2.ln_2,h.0-2.mlp,h.3,ln_f=cpu:4")).input_device();
    AdamW opt(weight_decay_groups(gpt->named_parameters(), 1e-2, 0.01));
    Trainer trainer(*gpt, opt, {.micro_batch = 2, .grad_clip = 0.5});
    const Tensor idx = test::random_tokens(5, 12, 40, 31, in), tgt = test::random_tokens(5, 12, 40, 32, in);
    manual_seed(77);
    std::vector<double> losses;
    for (int step = 0; step < 2; ++step)
      losses.push_back(trainer.step(5, [&](int64_t r, int64_t n) { return gpt->loss(narrow(idx, 0, r, n), narrow(tgt, 0, r, n)); }).loss);
    std::vector<std::vector<double>> params;
    for (const auto& [_, p] : gpt->named_parameters()) params.push_back(to(p, kCPU).to_double_vector());
    return std::make_pair(losses, params);
  };
  const auto want = run(false), got = run(true);
  CHECK(got.first == want.first);
  CHECK(got.second == want.second);
}
