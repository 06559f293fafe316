// Structured pruning (models/compress/): a masked model (the removed units' weights zeroed) and
// the pruned model (those units cut out) compute the same outputs; the pruned config rebuilds the
// model and reloads its safetensors; the allocator's parameter bytes drop exactly as the plan
// predicts; criteria pick the units they should; bad input is a clear error.
#include <catch2/catch.hpp>

#include <filesystem>

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "models/compress/structured_prune.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;

namespace {

MobileNetV2Config tiny_mobilenet() {
  return {.width_mult = 0.25, .num_classes = 10, .small_input = true, .dropout = 0.0, .input_size = 16};
}
GPTConfig tiny_gpt() { return {.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 32}; }

// Every parameter and buffer random (BatchNorm scales and statistics included, variances > 0),
// so no criterion sees ties and eval-mode BatchNorm is not the identity.
void randomize(Module& m, uint64_t seed) {
  NoGradGuard no_grad;
  for (auto& [name, t] : m.state_dict()) {
    if (!is_floating(t.dtype())) continue;
    const bool var = name.size() > 11 && name.substr(name.size() - 11) == "running_var";
    copy_(t, test::rand_tensor(t.shape(), seed++, t.dtype(), var ? 0.5 : -0.5, var ? 1.5 : 0.5));
  }
}

int64_t rounded(int64_t bytes) { return bytes < 512 ? 512 : (bytes + 511) / 512 * 512; }  // the allocator's rule

// Parameter-category bytes the allocator should hold for `state` after `plan` (one block per tensor).
int64_t predicted_bytes(const PrunePlan& plan, const NamedTensors& state) {
  int64_t total = 0;
  for (const auto& [name, t] : state) {
    PruneCount c = count_pruned(plan, {{name, t}});
    total += rounded(c.elements_after * int64_t(t.element_size()));
  }
  return total;
}

int64_t parameter_bytes(Device d) { return memory_stats(d).category(MemoryCategory::parameter).current; }

}  // namespace

// In f64, so that 17 blocks of random weights do not amplify float rounding: what differs between
// the masked and the pruned model is only the order of summation, so they agree far within 1e-6.
TEST_CASE("prune: MobileNetV2 expansion channels, masked == pruned, config and file round trip", "[prune]") {
  const MobileNetV2Config cfg = tiny_mobilenet();
  MobileNetV2 model(cfg, {.dtype = DType::f64});
  randomize(model, 11);
  model.eval();
  const Tensor x = test::rand_tensor({2, 3, 16, 16}, 5, DType::f64);

  const std::vector<PruneGroup> groups = mobilenet_v2_groups(cfg);
  REQUIRE(groups.size() == 16);  // every block but the first (expand ratio 1)
  auto crit = GENERATE(PruneCriterion::l1, PruneCriterion::l2, PruneCriterion::bn);
  auto scope = GENERATE(PruneScope::per_layer, PruneScope::global);
  INFO(prune_criterion_name(crit) << " " << prune_scope_name(scope));
  const PrunePlan plan = plan_pruning(model, groups, 0.5, crit, scope);
  int64_t kept = 0, total = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    kept += int64_t(plan.keep[i].size());
    total += groups[i].size;
    if (scope == PruneScope::per_layer) CHECK(int64_t(plan.keep[i].size()) == groups[i].size - groups[i].size / 2);
  }
  CHECK(total - kept == total / 2);

  NoGradGuard no_grad;
  mask_plan(plan, model);
  const Tensor masked = model.forward(x);
  auto pruned = prune_model(model, plan);
  pruned->eval();
  CHECK(pruned->num_parameters() < model.num_parameters());
  test::check_close(pruned->forward(x), masked, 0, 1e-6);

  // The config records the widths: rebuilt from its JSON and loaded from safetensors, it agrees.
  const MobileNetV2Config back = MobileNetV2Config::from_json(pruned->config().to_json());
  REQUIRE(back.block_hidden == pruned->config().block_hidden);
  const std::string path = (std::filesystem::temp_directory_path() / "mg_prune_mnv2.safetensors").string();
  pruned->save(path);
  MobileNetV2 reloaded(back, {.dtype = DType::f64});
  reloaded.load(path);
  reloaded.eval();
  test::check_close(reloaded.forward(x), masked, 0, 1e-6);
  std::filesystem::remove(path);
}

TEST_CASE("prune: GPT MLP units and heads, masked == pruned, sampling with the KV cache", "[prune]") {
  const GPTConfig cfg = tiny_gpt();
  GPT model(cfg);
  randomize(model, 21);
  model.eval();
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7, 0, 12, 4, 8}, {2, 6}, {.dtype = DType::i64});

  const bool mlp = GENERATE(true, false);
  const bool heads = GENERATE(true, false);
  if (!mlp && !heads) {
    CHECK_THROWS_WITH(gpt_groups(cfg, false, false), Catch::Contains("needs a target"));
    return;
  }
  auto crit = GENERATE(PruneCriterion::l1, PruneCriterion::l2);
  const PrunePlan plan = plan_pruning(model, gpt_groups(cfg, mlp, heads), 0.5, crit, PruneScope::per_layer);
  NoGradGuard no_grad;
  mask_plan(plan, model);
  const Tensor masked = model.forward(idx);
  auto pruned = prune_model(model, plan);
  pruned->eval();
  const GPTConfig& pc = pruned->config();
  CHECK(pc.mlp_hidden == (mlp ? std::vector<int64_t>{64, 64} : std::vector<int64_t>{}));
  CHECK(pc.layer_heads == (heads ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{}));
  test::check_close(pruned->forward(idx), masked, 0, 1e-6);
  CHECK(GPTConfig::from_json(pc.to_json()).to_json() == pc.to_json());

  // Greedy sampling: the KV cache (per-layer head counts) agrees with recomputing the window.
  const std::vector<int64_t> prompt = {1, 2, 3};
  CHECK(pruned->generate(prompt, 6, {.temperature = 0.0}) ==
        pruned->generate(prompt, 6, {.temperature = 0.0, .use_kv_cache = false}));
}

TEST_CASE("prune: parameter bytes in the allocator drop exactly as the plan predicts", "[prune]") {
  const Device dev("cpu:7");
  const int64_t before = parameter_bytes(dev);
  MobileNetV2 model(tiny_mobilenet(), {.device = dev});
  const int64_t full = parameter_bytes(dev) - before;
  const PrunePlan plan = plan_pruning(model, mobilenet_v2_groups(model.config()), 0.5, PruneCriterion::l1,
                                      PruneScope::per_layer);
  const int64_t predicted = predicted_bytes(plan, model.state_dict());
  {
    auto pruned = prune_model(model, plan);
    const int64_t got = parameter_bytes(dev) - before - full;
    CHECK(got == predicted);
    CHECK(full - got > full / 10);  // (the 1280-channel head of this 0.25-wide model is not pruned)
  }
  CHECK(parameter_bytes(dev) - before == full);  // the pruned model's bytes are freed with it

  // GPT, 50% of the MLP units: c_fc and c_proj shrink to half.
  const Device dev2("cpu:8");
  GPT gpt(tiny_gpt(), {.device = dev2});
  const int64_t gfull = parameter_bytes(dev2);
  const PrunePlan gplan = plan_pruning(gpt, gpt_groups(gpt.config(), true, false), 0.5, PruneCriterion::l1,
                                       PruneScope::per_layer);
  auto gpruned = prune_model(gpt, gplan);
  CHECK(parameter_bytes(dev2) - gfull == predicted_bytes(gplan, gpt.state_dict()));
}

TEST_CASE("prune: criteria pick the least important units", "[prune]") {
  GPT model(tiny_gpt());
  randomize(model, 31);
  // Zero MLP unit 5 of block 0 (its c_fc row and c_proj column): every criterion scores it 0.
  const std::vector<PruneGroup> groups = gpt_groups(model.config(), true, false);
  {
    NoGradGuard no_grad;
    std::map<std::string, Tensor> state;
    for (auto& [n, t] : model.state_dict()) state[n] = t;
    for (const GroupMember& m : groups[0].members) zero_units(state.at(m.tensor), m, groups[0].size, {5});
  }
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : model.state_dict()) state[n] = t;
  for (auto c : {PruneCriterion::l1, PruneCriterion::l2}) {
    const std::vector<double> imp = unit_importance(groups[0], state, c);
    CHECK(imp[5] == 0.0);
    CHECK(*std::min_element(imp.begin(), imp.end()) == 0.0);
    CHECK(imp[4] > 0.0);
  }
  // l1 by hand for one unit: sum |c_fc row| + |bias| + |c_proj column|.
  const auto fc = state.at("h.0.mlp.c_fc.weight").to_double_vector(), b = state.at("h.0.mlp.c_fc.bias").to_double_vector(),
             pj = state.at("h.0.mlp.c_proj.weight").to_double_vector();
  double l1 = std::abs(b[7]);
  for (int64_t c = 0; c < 32; ++c) l1 += std::abs(fc[size_t(7 * 32 + c)]) + std::abs(pj[size_t(c * 128 + 7)]);
  CHECK(unit_importance(groups[0], state, PruneCriterion::l1)[7] == Approx(l1).epsilon(1e-12));

  // taylor: sum over batches of |grad * w|; the zeroed unit scores 0 and goes first.
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7}, {2, 4}, {.dtype = DType::i64});
  const Tensor tgt = from_vector(std::vector<double>{5, 9, 3, 30, 2, 7, 7, 0}, {2, 4}, {.dtype = DType::i64});
  const GroupScores ts = taylor_importance(model, groups, 2, [&] { return model.loss(idx, tgt); });
  CHECK(ts.at("h.0.mlp")[5] == 0.0);
  CHECK(ts.at("h.0.mlp")[4] > 0.0);
  const PrunePlan plan = plan_pruning(model, groups, 0.25, PruneCriterion::taylor, PruneScope::per_layer, &ts);
  CHECK(std::find(plan.keep[0].begin(), plan.keep[0].end(), 5) == plan.keep[0].end());
  for (const Tensor& p : model.parameters()) CHECK_FALSE(p.grad().defined());  // gradients dropped

  // bn: the smallest |gamma| (summed over the block's two BatchNorms) goes.
  MobileNetV2 mnv2(tiny_mobilenet());
  randomize(mnv2, 41);
  {
    NoGradGuard no_grad;
    std::map<std::string, Tensor> s;
    for (auto& [n, t] : mnv2.state_dict()) s[n] = t;
    fill_(s.at("features.2.conv.0.bn.weight"), 1.0);
    fill_(s.at("features.2.conv.1.bn.weight"), 1.0);
    fill_(narrow(s.at("features.2.conv.0.bn.weight"), 0, 3, 1), 0.01);
    fill_(narrow(s.at("features.2.conv.1.bn.weight"), 0, 3, 1), -0.01);
  }
  const auto mgroups = mobilenet_v2_groups(mnv2.config());
  const double one_unit = 1.0 / double(mgroups[0].size) + 1e-9;  // floor(amount * size) == 1
  const PrunePlan bplan = plan_pruning(mnv2, mgroups, one_unit, PruneCriterion::bn, PruneScope::per_layer);
  CHECK(bplan.groups[0].name == "features.2");
  CHECK(int64_t(bplan.keep[0].size()) == bplan.groups[0].size - 1);
  CHECK(std::find(bplan.keep[0].begin(), bplan.keep[0].end(), 3) == bplan.keep[0].end());
}

TEST_CASE("prune: optimizer state is cut with its parameter", "[prune]") {
  GPT model(tiny_gpt());
  const PrunePlan plan = plan_pruning(model, gpt_groups(model.config(), false, true), 0.5, PruneCriterion::l1,
                                      PruneScope::per_layer);
  const Tensor w = model.state_dict().front().second;
  const Tensor exp_avg = test::rand_tensor({96, 32}, 3, DType::f32), step = scalar_tensor(7.0);
  CHECK_THROWS_WITH(apply_plan(plan, {{"h.0.attn.c_attn.weight.exp_avg", exp_avg}}), Catch::Contains("has no tensor"));
  const NamedTensors out = apply_plan_to_optimizer_state(plan, {{"h.0.attn.c_attn.weight.exp_avg", exp_avg},
                                             {"h.0.attn.c_attn.weight.step", step},
                                             {"wte.weight.exp_avg", w}});
  REQUIRE(out.size() == 3);
  CHECK(out[0].second.shape() == Shape{48, 32});  // 2 of 4 heads: q, k, v rows of each kept head
  const int64_t h = plan.keep[0][0];              // the first kept head's q rows come first
  test::check_close(narrow(out[0].second, 0, 0, 8), narrow(exp_avg, 0, h * 8, 8), 0, 0);
  test::check_close(narrow(out[0].second, 0, 16, 8), narrow(exp_avg, 0, 32 + h * 8, 8), 0, 0);  // its k rows
  CHECK(out[1].second.is_same(step));
  CHECK(out[2].second.is_same(w));
}

TEST_CASE("prune: bad input is a clear error", "[prune]") {
  GPT model(tiny_gpt());
  const auto groups = gpt_groups(model.config(), true, false);
  for (double a : {-0.1, 1.0, 1.5})
    CHECK_THROWS_WITH(plan_pruning(model, groups, a, PruneCriterion::l1, PruneScope::per_layer),
                      Catch::Contains("--amount must be in [0, 1)"));
  CHECK_THROWS_WITH(plan_pruning(model, groups, 0.5, PruneCriterion::bn, PruneScope::per_layer),
                    Catch::Contains("has no BatchNorm"));
  CHECK_THROWS_WITH(plan_pruning(model, groups, 0.5, PruneCriterion::taylor, PruneScope::per_layer),
                    Catch::Contains("needs gradients"));
  CHECK_THROWS_WITH(taylor_importance(model, groups, 0, [&] { return Tensor(); }), Catch::Contains("at least one batch"));
  CHECK_THROWS_WITH(parse_prune_criterion("l3"), Catch::Contains("known: l1, l2, bn, taylor"));
  // A global ranking that would empty a whole group (layer) is refused.
  std::vector<PruneGroup> two = {{.name = "a", .kind = "mlp", .size = 4}, {.name = "b", .kind = "mlp", .size = 4}};
  CHECK_THROWS_WITH(select_units(two, {{1, 1, 1, 1}, {0, 0, 0, 4}}, 0.9, PruneScope::global),
                    Catch::Contains("would remove all 4 units of 'a'"));
  CHECK(select_units(two, {{1, 1, 1, 1}, {0, 0, 0, 4}}, 0.9, PruneScope::per_layer)[0].size() == 1);
  // A config whose widths do not fit the architecture is refused.
  GPTConfig bad = tiny_gpt();
  bad.mlp_hidden = {64};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("one width per layer"));
  MobileNetV2Config mbad = tiny_mobilenet();
  mbad.block_hidden = mbad.default_block_hidden();
  mbad.block_hidden[3] += 8;
  CHECK_THROWS_WITH(mbad.validate(), Catch::Contains("block_hidden[3] = "));
  mbad.block_hidden.pop_back();
  CHECK_THROWS_WITH(mbad.validate(), Catch::Contains("must list the 17 blocks"));
}
