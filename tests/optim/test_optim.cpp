// Optimizers: SGD (momentum, Nesterov, weight decay) and AdamW one- and two-step values worked
// out by hand, four optimizers against PyTorch, bf16 master weights, optimizer state tagged
// optimizer_state and allocated lazily (also on meta), a saved-and-resumed run that continues
// bit for bit, state-file errors, weight-decay groups by rank, schedules and clip_grad_norm.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "core/safetensors.h"
#include "models/nn/layers.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "test_helpers.h"

using namespace mg;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mg_optim_" + std::to_string(::getpid()) + "_" + name)).string();
}

Tensor param(const std::vector<double>& v, const Shape& shape, DType dtype = DType::f64, Device dev = kCPU) {
  Tensor p = from_vector(v, shape, {.dtype = dtype, .device = dev});
  p.set_requires_grad(true);
  return p;
}

// Runs `steps` steps of opt on p with the given gradients (one per step).
void run_steps(Optimizer& opt, const Tensor& p, const std::vector<std::vector<double>>& grads) {
  for (const auto& g : grads) {
    p.set_grad(from_vector(g, p.shape(), {.dtype = p.dtype(), .device = p.device()}));
    opt.step();
  }
}

int64_t round512(int64_t n) { return (n + 511) / 512 * 512; }

}  // namespace

// p = [1, -2], the same gradient g = [0.5, 0.25] at both steps, lr 0.1, momentum 0.9, wd 0.01.
TEST_CASE("optim: SGD with momentum and weight decay, by hand", "[optim]") {
  Tensor p = param({1.0, -2.0}, {2});
  SGD opt(NamedTensors{{"p", p}}, 0.1, 0.01, {.momentum = 0.9});
  run_steps(opt, p, {{0.5, 0.25}});
  // d = g + wd p = [0.5 + 0.01, 0.25 - 0.02] = [0.51, 0.23]; buf = d (first step: a copy)
  // p = p - lr buf = [1 - 0.051, -2 - 0.023]
  test::check_values(p, {0.949, -2.023}, 1e-14, 1e-14);
  test::check_values(opt.state("p")->tensors[0].second, {0.51, 0.23}, 1e-14, 1e-14);
  run_steps(opt, p, {{0.5, 0.25}});
  // d = [0.5 + 0.00949, 0.25 - 0.02023] = [0.50949, 0.22977]
  // buf = 0.9 [0.51, 0.23] + d = [0.96849, 0.43677];  p = [0.949 - 0.096849, -2.023 - 0.043677]
  test::check_values(p, {0.852151, -2.066677}, 1e-14, 1e-14);
  CHECK(opt.state("p")->step == 2);
  CHECK(opt.step_count() == 2);
}

TEST_CASE("optim: SGD with Nesterov momentum, by hand", "[optim]") {
  Tensor p = param({1.0, -2.0}, {2});
  SGD opt(NamedTensors{{"p", p}}, 0.1, 0.01, {.momentum = 0.9, .nesterov = true});
  run_steps(opt, p, {{0.5, 0.25}});
  // d = [0.51, 0.23]; buf = d; step = d + 0.9 buf = [0.969, 0.437]; p = [1 - 0.0969, -2 - 0.0437]
  test::check_values(p, {0.9031, -2.0437}, 1e-14, 1e-14);
  run_steps(opt, p, {{0.5, 0.25}});
  // d = [0.5 + 0.009031, 0.25 - 0.020437] = [0.509031, 0.229563]
  // buf = 0.9 [0.51, 0.23] + d = [0.968031, 0.436563]
  // step = d + 0.9 buf = [1.3802589, 0.6224697];  p = [0.9031 - 0.13802589, -2.0437 - 0.06224697]
  test::check_values(p, {0.76507411, -2.10594697}, 1e-14, 1e-14);
  CHECK_THROWS_WITH(SGD(NamedTensors{{"p", p}}, 0.1, 0.0, {.momentum = 0.0, .nesterov = true}),
                    Catch::Contains("Nesterov momentum requires momentum > 0"));
}

TEST_CASE("optim: plain SGD keeps no state tensors", "[optim]") {
  Tensor p = param({1.0, -2.0}, {2});
  SGD opt(NamedTensors{{"p", p}}, 0.5);
  run_steps(opt, p, {{0.5, 0.25}});
  test::check_values(p, {0.75, -2.125}, 1e-15, 0);  // p - 0.5 g
  CHECK(opt.state("p")->tensors.empty());
}

// p = [1, -2], g = [0.5, 0.25] at both steps, lr 0.1, wd 0.1, betas (0.9, 0.999), eps 1e-8.
TEST_CASE("optim: AdamW one and two steps, by hand", "[optim]") {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dt);
    const double tol = dt == DType::f64 ? 1e-13 : 2e-7;
    Tensor p = param({1.0, -2.0}, {2}, dt);
    AdamW opt(NamedTensors{{"p", p}}, 0.1, 0.1);
    run_steps(opt, p, {{0.5, 0.25}});
    // decay: p *= 1 - lr wd = 0.99 -> [0.99, -1.98]
    // m = 0.1 g = [0.05, 0.025]; v = 0.001 g^2 = [0.00025, 0.0000625]
    // m / (1 - 0.9) = g; sqrt(v) / sqrt(1 - 0.999) = |g|; update = lr g / (|g| + 1e-8)
    //   = [0.1 * 0.5 / 0.50000001, 0.1 * 0.25 / 0.25000001] = [0.099999998, 0.099999996]
    test::check_values(p, {0.99 - 0.1 * 0.5 / 0.50000001, -1.98 - 0.1 * 0.25 / 0.25000001}, tol, tol);
    test::check_values(opt.state("p")->tensors[0].second, {0.05, 0.025}, tol, tol);
    test::check_values(opt.state("p")->tensors[1].second, {0.00025, 0.0000625}, tol, tol);
    run_steps(opt, p, {{0.5, 0.25}});
    // decay: [0.890000002 * 0.99, -2.079999996 * 0.99] = [0.88110000198, -2.05919999604]
    // m = 0.9 m + 0.1 g = [0.095, 0.0475]; v = 0.999 v + 0.001 g^2 = [0.00049975, 0.0001249375]
    // m / (1 - 0.81) = [0.5, 0.25]; v / (1 - 0.998001) = v / 0.001999 = [0.25, 0.0625] -> sqrt = [0.5, 0.25]
    // update = [0.1 * 0.5 / 0.50000001, 0.1 * 0.25 / 0.25000001] again
    test::check_values(p, {0.88110000198 - 0.1 * 0.5 / 0.50000001, -2.05919999604 - 0.1 * 0.25 / 0.25000001}, tol, tol);
    test::check_values(opt.state("p")->tensors[1].second, {0.00049975, 0.0001249375}, tol, tol);
  }
}

// Reference values from PyTorch 1.13 (Debian's python3-torch), computed once with
// OMP_NUM_THREADS=2 /usr/bin/python3 and this script:
//   import torch
//   p0 = [[0.5, -1.25, 2.0], [-0.75, 0.125, 1.5]]
//   g1 = [[0.3, -0.2, 0.1], [0.05, -0.4, 0.25]]
//   g2 = [[-0.1, 0.15, 0.3], [0.2, 0.05, -0.35]]
//   def run(make):
//       p = torch.tensor(p0, dtype=torch.float64, requires_grad=True)
//       opt = make([p])
//       for g in (g1, g2):
//           p.grad = torch.tensor(g, dtype=torch.float64); opt.step()
//       return ", ".join("%.17g" % v for v in p.detach().flatten().tolist())
//   print("sgd", run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)))
//   print("nesterov", run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)))
//   print("adam", run(lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)))
//   print("adamw", run(lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)))
TEST_CASE("optim: SGD, Adam and AdamW agree with PyTorch over two steps", "[optim]") {
  const std::vector<double> p0 = {0.5, -1.25, 2.0, -0.75, 0.125, 1.5};
  const std::vector<std::vector<double>> grads = {{0.3, -0.2, 0.1, 0.05, -0.4, 0.25}, {-0.1, 0.15, 0.3, 0.2, 0.05, -0.35}};
  const AdamOptions adam_opt{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6};
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dt);
    const double tol = dt == DType::f64 ? 1e-13 : 1e-6;
    auto check = [&](auto make, const std::vector<double>& expected) {
      Tensor p = param(p0, {2, 3}, dt);
      auto opt = make(NamedTensors{{"p", p}});
      run_steps(*opt, p, grads);
      test::check_values(p, expected, tol, tol);
    };
    check([](const NamedTensors& ps) { return std::make_unique<SGD>(ps, 0.1, 0.01, SgdOptions{.momentum = 0.9, .dampening = 0.1}); },
          {0.45062744999999998, -1.2220191250000001, 1.9484108, -0.77539617500000002, 0.19611411249999999,
           1.4798238500000001});
    check([](const NamedTensors& ps) { return std::make_unique<SGD>(ps, 0.1, 0.01, SgdOptions{.momentum = 0.9, .nesterov = true}); },
          {0.435505105, -1.2186142124999999, 1.90672332, -0.79807715750000008, 0.22317980125, 1.4919306649999999});
    check([&](const NamedTensors& ps) { return std::make_unique<Adam>(ps, 0.01, 0.1, adam_opt); },
          {0.48490092076497154, -1.2343471765234035, 1.9800396927239075, -0.74646858193504673, 0.13994386023663977,
           1.4879083685777763});
    check([&](const NamedTensors& ps) { return std::make_unique<AdamW>(ps, 0.01, 0.1, adam_opt); },
          {0.48552520818804912, -1.2371968107216587, 1.9765898862581881, -0.7676168684355803, 0.14001529174212016,
           1.4897492840409579});
  }
}

TEST_CASE("optim: bf16 parameters are updated through an f32 master copy", "[optim]") {
  // 50 steps of -1e-4 on a bf16 1.0: alone each would round back to 1.0 (bf16's step below 1 is
  // 2^-8); the master accumulates 0.995, which rounds to the bf16 value 0.99609375.
  Tensor p = param({1.0}, {1}, DType::bf16);
  SGD opt(NamedTensors{{"p", p}}, 1e-4);
  for (int i = 0; i < 50; ++i) run_steps(opt, p, {{1.0}});
  const ParamState* s = opt.state("p");
  REQUIRE(s->master.defined());
  CHECK(s->master.dtype() == DType::f32);
  CHECK(s->master.item() == Approx(0.995).epsilon(1e-5));
  CHECK(p.item() == 0.99609375);
  CHECK(p.dtype() == DType::bf16);
}

TEST_CASE("optim: state is allocated lazily as optimizer_state and grads are dropped", "[optim]") {
  const Device dev("cpu:14");
  Generator gen(1);
  Linear fc(64, 64, true, {.gen = &gen, .device = dev});
  fc.to(DType::bf16);
  AdamW opt(weight_decay_groups(fc.named_parameters(), 1e-3, 0.01));
  CHECK(memory_stats(dev).category(MemoryCategory::optimizer_state).current == 0);
  const uint64_t version = fc.weight.version();
  {
    MemoryCategoryGuard g(MemoryCategory::gradient);
    for (auto& p : fc.parameters()) p.set_grad(full(p.shape(), 0.5, {.dtype = p.dtype(), .device = dev}));
  }
  opt.step();
  CHECK(fc.weight.version() > version);
  // exp_avg, exp_avg_sq and the f32 master for each of weight (64 x 64) and bias (64).
  const int64_t expected = 3 * round512(64 * 64 * 4) + 3 * round512(64 * 4);
  CHECK(memory_stats(dev).category(MemoryCategory::optimizer_state).current == expected);
  for (const auto& [_, t] : opt.state("weight")->tensors) CHECK(t.storage()->category() == MemoryCategory::optimizer_state);
  CHECK(memory_stats(dev).category(MemoryCategory::gradient).current > 0);
  opt.zero_grad();
  CHECK(memory_stats(dev).category(MemoryCategory::gradient).current == 0);
  CHECK_FALSE(fc.weight.grad().defined());
  // A step without gradients changes nothing and allocates nothing.
  opt.step();
  CHECK(opt.state("weight")->step == 1);

  // On meta the same state is allocated (for memory estimates) and no arithmetic runs.
  Linear on_meta(32, 16, true, {.device = kMeta});
  Adam meta_opt(on_meta.named_parameters(), 1e-3);
  const int64_t before = memory_stats(kMeta).category(MemoryCategory::optimizer_state).current;
  for (auto& p : on_meta.parameters()) p.set_grad(empty(p.shape(), {.device = kMeta}));
  meta_opt.step();
  CHECK(memory_stats(kMeta).category(MemoryCategory::optimizer_state).current - before ==
        2 * round512(32 * 16 * 4) + 2 * round512(16 * 4));
}

TEST_CASE("optim: weight_decay_groups decays by rank, not by position", "[optim]") {
  Sequential net({std::make_shared<Linear>(3, 4), std::make_shared<LayerNorm>(4), std::make_shared<Embedding>(5, 4)});
  auto groups = weight_decay_groups(net.named_parameters(), 0.01, 0.1);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].name == "decay");
  CHECK(groups[0].weight_decay == 0.1);
  CHECK(groups[1].weight_decay == 0.0);
  std::vector<std::string> decay, no_decay;
  for (auto& [n, _] : groups[0].params) decay.push_back(n);
  for (auto& [n, _] : groups[1].params) no_decay.push_back(n);
  CHECK(decay == std::vector<std::string>{"0.weight", "2.weight"});
  CHECK(no_decay == std::vector<std::string>{"0.bias", "1.weight", "1.bias"});
  AdamW opt(groups);
  opt.set_lr(0.5);
  CHECK(opt.param_groups()[1].lr == 0.5);
  CHECK_THROWS_WITH(AdamW(NamedTensors{{"a", net[0]->parameters()[0]}, {"a", net[0]->parameters()[1]}}, 0.1),
                    Catch::Contains("two parameters are named 'a'"));
}

TEST_CASE("optim: a group's lr_scale survives set_lr and a saved state", "[optim]") {
  Sequential net({std::make_shared<Linear>(3, 4), std::make_shared<LayerNorm>(4)});
  auto groups = weight_decay_groups(net.named_parameters(), 0.01, 0.1);
  groups[1].lr_scale = 0.25;
  AdamW opt(groups);
  opt.set_lr(0.4);
  CHECK(opt.param_groups()[0].lr == 0.4);
  CHECK(opt.param_groups()[1].lr == Approx(0.1));
  const auto meta = opt.state_metadata();
  CHECK(meta.at("group.1.lr_scale") == "0.25");
  auto fresh_groups = weight_decay_groups(net.named_parameters(), 0.01, 0.1);
  AdamW resumed(fresh_groups);
  resumed.load_state_dict(opt.state_dict(), meta);
  CHECK(resumed.param_groups()[1].lr_scale == 0.25);
  resumed.set_lr(0.8);  // the resumed schedule keeps the ratio
  CHECK(resumed.param_groups()[1].lr == Approx(0.2));
  auto older = meta;  // a state file from before lr_scale: the group's own (1) stays
  older.erase("group.1.lr_scale");
  AdamW from_old(weight_decay_groups(net.named_parameters(), 0.01, 0.1));
  from_old.load_state_dict(opt.state_dict(), older);
  CHECK(from_old.param_groups()[1].lr_scale == 1.0);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    auto g = weight_decay_groups(net.named_parameters(), 0.01, 0.1);
    g[0].lr_scale = bad;
    CHECK_THROWS_WITH(AdamW(g), Catch::Contains("lr_scale") && Catch::Contains("positive and finite"));
  }
}

// A run saved after two steps and resumed in a fresh process-like setup (new model, new
// optimizer, both loaded from files) takes exactly the steps the uninterrupted run takes.
TEST_CASE("optim: a saved and resumed run continues bit for bit", "[optim]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dt);
    auto make_net = [&](uint64_t seed) {
      Generator gen(seed);
      auto net = std::make_shared<Sequential>(std::vector<std::shared_ptr<UnaryModule>>{
          std::make_shared<Linear>(3, 8, true, InitOptions{.gen = &gen}), std::make_shared<GELU>(),
          std::make_shared<Linear>(8, 2, true, InitOptions{.gen = &gen})});
      net->to(dt);
      return net;
    };
    Tensor x = cast(test::rand_tensor({6, 3}, 1, DType::f32), dt);
    Tensor y = cast(test::rand_tensor({6, 2}, 2, DType::f32), dt);
    const LrSchedule sched = LrSchedule::cosine(0.05, 2, 6, 0.005);
    auto train_step = [&](Sequential& net, AdamW& opt, int64_t step) {
      opt.set_lr(sched(step));
      Tensor loss = mse_loss(cast(net.forward(x), DType::f32), cast(y, DType::f32));
      backward(loss);
      opt.step();
      opt.zero_grad();
    };
    auto a = make_net(1);
    AdamW opt_a(weight_decay_groups(a->named_parameters(), 0.05, 0.1));
    train_step(*a, opt_a, 0);
    train_step(*a, opt_a, 1);
    const std::string model_file = temp_path("model.safetensors"), opt_file = temp_path("optim.safetensors");
    a->save(model_file);
    opt_a.save(opt_file);
    train_step(*a, opt_a, 2);
    train_step(*a, opt_a, 3);

    auto b = make_net(99);
    b->load(model_file);
    AdamW opt_b(weight_decay_groups(b->named_parameters(), 0.05, 0.1));
    opt_b.load(opt_file);
    CHECK(opt_b.step_count() == 2);
    CHECK(opt_b.lr() == sched(1));
    CHECK(opt_b.state("0.weight")->step == 2);
    train_step(*b, opt_b, 2);
    train_step(*b, opt_b, 3);
    auto pa = a->named_parameters(), pb = b->named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].first);
      CHECK(pa[i].second.to_double_vector() == pb[i].second.to_double_vector());
    }
    // The file names every state "<param>.<state>".
    auto file = load_safetensors(opt_file);
    std::vector<std::string> names;
    for (auto& [n, _] : file) names.push_back(n);
    CHECK(std::find(names.begin(), names.end(), "0.weight.exp_avg_sq") != names.end());
    CHECK(std::find(names.begin(), names.end(), "2.bias.step") != names.end());
    CHECK((std::find(names.begin(), names.end(), "2.bias.master") != names.end()) == (dt == DType::bf16));
    std::filesystem::remove(model_file);
    std::filesystem::remove(opt_file);
  }
}

TEST_CASE("optim: bad state files are errors naming the key", "[optim]") {
  Tensor p = param({1.0, 2.0}, {2}, DType::f32);
  AdamW adamw(NamedTensors{{"p", p}}, 0.1);
  run_steps(adamw, p, {{0.1, 0.2}});
  auto state = adamw.state_dict();
  auto meta = adamw.state_metadata();
  SGD sgd(NamedTensors{{"p", p}}, 0.1, 0.0, {.momentum = 0.9});
  CHECK_THROWS_WITH(sgd.load_state_dict(state, meta), Catch::Contains("the state was saved by AdamW, not SGD"));
  AdamW other(NamedTensors{{"p", p}}, 0.1);
  auto extra = state;
  extra.emplace_back("q.exp_avg", zeros({2}));
  CHECK_THROWS_WITH(other.load_state_dict(extra, meta), Catch::Contains("key 'q.exp_avg' names no parameter"));
  auto bad_shape = state;
  for (auto& [n, t] : bad_shape)
    if (n == "p.exp_avg") t = zeros({3});
  CHECK_THROWS_WITH(other.load_state_dict(bad_shape, meta), Catch::Contains("key 'p.exp_avg': (3,) f32 in the state vs (2,) f32"));
  auto unknown = state;
  unknown.emplace_back("p.momentum_buffer", zeros({2}));
  CHECK_THROWS_WITH(other.load_state_dict(unknown, meta), Catch::Contains("'momentum_buffer' is not a state of AdamW"));
  NamedTensors partial;
  for (auto& e : state)
    if (e.first != "p.exp_avg_sq") partial.push_back(e);
  CHECK_THROWS_WITH(other.load_state_dict(partial, meta), Catch::Contains("the state of 'p' is incomplete"));
  CHECK(other.state("p") == nullptr);  // nothing was loaded by the failed attempts
  CHECK_NOTHROW(other.load_state_dict(state, meta));
  CHECK(other.state("p")->step == 1);
}

TEST_CASE("optim: learning-rate schedules", "[optim]") {
  CHECK(constant_lr(0.3, 0) == 0.3);
  CHECK(constant_lr(0.3, 1000) == 0.3);
  // gamma 0.5 every 3 steps
  CHECK(step_lr(1.0, 0, 3, 0.5) == 1.0);
  CHECK(step_lr(1.0, 2, 3, 0.5) == 1.0);
  CHECK(step_lr(1.0, 3, 3, 0.5) == 0.5);
  CHECK(step_lr(1.0, 7, 3, 0.5) == 0.25);
  // warmup 10 steps to 1.0, cosine to 0.1 at step 110
  CHECK(cosine_lr(1.0, 0, 10, 110, 0.1) == Approx(0.1));   // 1/10
  CHECK(cosine_lr(1.0, 4, 10, 110, 0.1) == Approx(0.5));   // 5/10
  CHECK(cosine_lr(1.0, 9, 10, 110, 0.1) == Approx(1.0));
  CHECK(cosine_lr(1.0, 10, 10, 110, 0.1) == Approx(1.0));  // cos(0)
  CHECK(cosine_lr(1.0, 60, 10, 110, 0.1) == Approx(0.55)); // halfway: 0.1 + 0.5 * 0.9
  CHECK(cosine_lr(1.0, 85, 10, 110, 0.1) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.75))));
  CHECK(cosine_lr(1.0, 110, 10, 110, 0.1) == Approx(0.1));
  CHECK(cosine_lr(1.0, 500, 10, 110, 0.1) == 0.1);
  CHECK(cosine_lr(1.0, 0, 0, 10, 0.0) == 1.0);  // no warmup
  LrSchedule s = LrSchedule::cosine(1.0, 10, 110, 0.1);
  CHECK(s(60) == cosine_lr(1.0, 60, 10, 110, 0.1));
  CHECK(LrSchedule::step_decay(1.0, 3, 0.5)(6) == 0.25);
  CHECK(s.str() == "cosine(lr=1, warmup=10, total=110, min=0.1)");
  CHECK_THROWS_WITH(cosine_lr(1.0, 0, 10, 10, 0.0), Catch::Contains("warmup_steps < total_steps"));
}

TEST_CASE("optim: clip_grad_norm scales to max_norm and reports non-finite norms", "[optim]") {
  Tensor a = param({0, 0}, {2}, DType::f32), b = param({0}, {1}, DType::f32), c = param({0}, {1}, DType::f32);
  a.set_grad(from_vector({3.0, 4.0}, {2}));
  b.set_grad(from_vector({12.0}, {1}));
  // norm = sqrt(9 + 16 + 144) = 13; c has no gradient and is skipped.
  CHECK(clip_grad_norm({a, b, c}, 100.0) == Approx(13.0));
  test::check_values(a.grad(), {3, 4});
  CHECK(clip_grad_norm({a, b, c}, 6.5) == Approx(13.0));
  const double coef = 6.5 / (13.0 + 1e-6);
  test::check_values(a.grad(), {3 * coef, 4 * coef}, 1e-6);
  test::check_values(b.grad(), {12 * coef}, 1e-6);
  CHECK(grad_norm({a, b}) == Approx(6.5).epsilon(1e-6));

  b.set_grad(from_vector({std::numeric_limits<double>::quiet_NaN()}, {1}));
  CHECK(std::isnan(clip_grad_norm({a, b}, 1.0)));
  test::check_values(a.grad(), {3 * coef, 4 * coef}, 1e-6);  // left alone
  b.set_grad(from_vector({std::numeric_limits<double>::infinity()}, {1}));
  CHECK(std::isinf(clip_grad_norm({a, b}, 1.0)));
  CHECK_THROWS_WITH(clip_grad_norm({a}, 0.0), Catch::Contains("max_norm must be positive"));
}

TEST_CASE("optim: clip_grad_norm does not depend on the thread count", "[optim]") {
  Tensor p = param(std::vector<double>(100000, 0.0), {100000}, DType::f32);
  p.set_grad(test::rand_tensor({100000}, 3, DType::f32));
  const int threads = num_threads();
  set_num_threads(1);
  const double one = grad_norm({p});
  set_num_threads(std::max(2, threads));
  const double many = grad_norm({p});
  set_num_threads(threads);
  CHECK(one == many);
  CHECK(one == Approx(std::sqrt(100000.0 / 3.0)).epsilon(0.01));  // E[u^2] = 1/3 for U(-1, 1)
}
