// Tensor parallelism: the f/g ops pass gradcheck across devices; a tensor-split GPT gives the
// single-device loss and gradients (f64: to 1e-10, only c_proj's partial sums are reassociated)
// and the same losses over AdamW steps (f32: to 2e-6 relative); each device holds 1/N of the
// blocks' projection weights; bad device counts are refused with one clear message.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "autograd/gradcheck.h"
#include "optim/adam.h"
#include "parallel/shard_comm.h"
#include "parallel/split.h"
#include "parallel/tensor_parallel.h"
#include "parallel_test_util.h"

using namespace mg;

namespace {

GPTConfig tp_config() { return {.vocab_size = 40, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 16}; }

std::shared_ptr<GPT> gpt_on(Device d, const GPTConfig& cfg = tp_config()) {
  Generator gen(7);
  return std::make_shared<GPT>(cfg, InitOptions{.gen = &gen, .device = d});
}

// Largest |a - b| over largest |b|, element by element over same-named tensors.
double max_rel_diff(const NamedTensors& got, const NamedTensors& want) {
  std::map<std::string, Tensor> w(want.begin(), want.end());
  REQUIRE(got.size() == w.size());
  double worst = 0;
  for (const auto& [n, g] : got) {
    INFO(n);
    REQUIRE(w.count(n));
    REQUIRE(g.shape() == w.at(n).shape());
    const auto a = to(g, kCPU).to_double_vector(), b = to(w.at(n), kCPU).to_double_vector();
    double scale = 0, diff = 0;
    for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(b[i])), diff = std::max(diff, std::abs(a[i] - b[i]));
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

NamedTensors grads_of(const Module& m) {
  NamedTensors out;
  for (const auto& [n, p] : m.named_parameters()) out.emplace_back(n, p.grad());
  return out;
}

}  // namespace

TEST_CASE("tensor parallel: f and g pass gradcheck across devices", "[parallel]") {
  const Device a("cpu:1"), b("cpu:2");
  const Tensor x = test::leaf(test::rand_tensor({3, 4}, 1, DType::f64, -1.0, 1.0, a));
  const Tensor wa = to(test::rand_tensor({3, 4}, 2), a), wb = to(test::rand_tensor({3, 4}, 3), b);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> xs = broadcast_to_devices(in[0], {a, b});
        REQUIRE(xs[1].device() == b);
        return reduce_to_device(std::vector<Tensor>{mul(xs[0], wa), mul(tanh(xs[1]), wb)}, a);
      },
      {x});
  INFO(r.message);
  CHECK(r.ok);
  CHECK_THROWS_WITH(reduce_to_device(std::vector<Tensor>{x, to(test::rand_tensor({4, 3}, 4), b)}, a),
                    Catch::Contains("every part needs the shape and dtype of the first"));
}

TEST_CASE("tensor parallel: a split GPT gives the single-device loss and gradients", "[parallel]") {
  const Device a("cpu:1"), b("cpu:2");
  auto ref = gpt_on(a);
  auto tp = gpt_on(a);
  ref->to(DType::f64);
  tp->to(DType::f64);
  SECTION("selective checkpointing on") {
    ref->set_checkpoint(CheckpointPolicy::parse("selective"));
    tp->set_checkpoint(CheckpointPolicy::parse("selective"));
  }
  SECTION("no checkpointing") {}
  const ResolvedPlacement r = apply_tensor_parallel(*tp, {a, b});
  CHECK(is_tensor_parallel(*tp));
  CHECK(r.str() == "cpu:1 holds wte,wpe,h.0-1.ln_1,h.0-1.attn,h.0-1.attn.shards.0,h.0-1.ln_2,h.0-1.mlp,h.0-1.mlp.shards.0,"
                   "ln_f; cpu:2 holds h.0-1.attn.shards.1,h.0-1.mlp.shards.1");
  // The conversion keeps the function: the gathered weights are the single-device ones, exactly.
  CHECK(max_rel_diff(gather_tensor_parallel(*tp, kCPU), ref->named_parameters()) == 0.0);

  const Tensor idx = test::random_tokens(3, 12, 40, 5, a), tgt = test::random_tokens(3, 12, 40, 6, a);
  Tensor want = ref->loss(idx, tgt), got = tp->loss(idx, tgt);
  backward(want);
  backward(got);
  const double lw = want.item<double>(), lg = got.item<double>();
  INFO("loss single " << lw << " tensor-parallel " << lg);
  CHECK(std::abs(lg - lw) <= 1e-12 * std::abs(lw));
  for (const auto& [n, p] : tp->named_parameters()) {
    INFO(n);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().device() == p.device());
  }
  const double worst = max_rel_diff(gather_tensor_parallel(*tp, kCPU, /*grads=*/true), grads_of(*ref));
  INFO("largest gradient difference relative to the largest gradient of its tensor: " << worst);
  CHECK(worst <= 1e-10);
  CHECK(worst > 0.0);  // the row-parallel c_proj does reassociate its sums (or the split did nothing)
}

TEST_CASE("tensor parallel: f32 losses over AdamW steps track a single device", "[parallel]") {
  const Device a("cpu:1"), b("cpu:2"), c("cpu:3"), e("cpu:4");
  for (std::vector<Device> devices : {std::vector<Device>{b, a}, std::vector<Device>{a, b, c, e}}) {
    auto ref = gpt_on(a);
    auto tp = gpt_on(a);
    apply_tensor_parallel(*tp, devices);
    AdamW opt_ref(weight_decay_groups(ref->named_parameters(), 1e-2, 0.01));
    AdamW opt_tp(weight_decay_groups(tp->named_parameters(), 1e-2, 0.01));
    for (int step = 0; step < 4; ++step) {
      const Tensor idx = test::random_tokens(2, 16, 40, 10 + step, a), tgt = test::random_tokens(2, 16, 40, 20 + step, a);
      Tensor lr = ref->loss(idx, tgt);
      Tensor lt = tp->loss(to(idx, devices[0]), to(tgt, devices[0]));
      backward(lr);
      backward(lt);
      const double want = lr.item<double>(), got = to(lt, kCPU).item<double>();
      INFO(devices.size() << " devices, step " << step << ": loss " << want << " vs " << got);
      CHECK(std::abs(got - want) <= 2e-6 * std::abs(want));
      opt_ref.step();
      opt_tp.step();
      opt_ref.zero_grad();
      opt_tp.zero_grad();
    }
    for (const auto& [n, p] : tp->named_parameters()) {
      INFO(n);
      CHECK_FALSE(p.grad().defined());  // zero_grad reached every shard
    }
  }
}

TEST_CASE("tensor parallel: each device holds 1/N of every block's projections", "[parallel]") {
  const Device a("cpu:12"), b("cpu:13");
  const GPTConfig cfg{.vocab_size = 40, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 64};
  auto ref = gpt_on(kCPU, cfg);
  int64_t block_weights = 0, c_proj_biases = 0, rest = 0;  // elements, single device
  for (const auto& [n, p] : ref->named_parameters()) {
    const bool proj = n.find(".attn.") != std::string::npos || n.find(".mlp.") != std::string::npos;
    if (proj && n.ends_with("c_proj.bias")) c_proj_biases += p.numel();
    else if (proj) block_weights += p.numel();
    else rest += p.numel();
  }
  const int64_t before_a = memory_stats(a).category(MemoryCategory::parameter).current;
  const int64_t before_b = memory_stats(b).category(MemoryCategory::parameter).current;
  auto tp = gpt_on(a, cfg);
  apply_tensor_parallel(*tp, {a, b});
  std::map<std::string, int64_t> elements;  // by device
  for (const auto& [n, p] : tp->named_parameters()) elements[p.device().str()] += p.numel();
  CHECK(elements[b.str()] * 2 == block_weights);
  CHECK(elements[a.str()] == rest + c_proj_biases + block_weights / 2);
  const int64_t bytes_a = memory_stats(a).category(MemoryCategory::parameter).current - before_a;
  const int64_t bytes_b = memory_stats(b).category(MemoryCategory::parameter).current - before_b;
  INFO("parameter bytes: cpu:12 " << bytes_a << ", cpu:13 " << bytes_b << ", block projections " << 4 * block_weights);
  CHECK(double(bytes_b) == Approx(2.0 * double(block_weights)).epsilon(0.02));  // f32: 4 bytes / 2 devices
  CHECK(double(bytes_a) == Approx(4.0 * double(rest + c_proj_biases) + 2.0 * double(block_weights)).epsilon(0.02));
}

TEST_CASE("tensor parallel: bad device counts and widths are refused before anything moves", "[parallel]") {
  const Device a("cpu:1"), b("cpu:2"), c("cpu:3");
  auto gpt = gpt_on(a);  // 4 heads, MLP width 64
  CHECK_THROWS_WITH(apply_tensor_parallel(*gpt, {a, b, c}),
                    Catch::Contains("layer 0 has 4 attention heads, not divisible by 3 devices") &&
                        Catch::Contains("layer 1 has 4 attention heads") &&
                        Catch::Contains("hint: use a device count that divides n_head (4)"));
  CHECK_THROWS_WITH(apply_tensor_parallel(*gpt, {a}), Catch::Contains("--split tensor needs at least two devices"));
  CHECK_THROWS_WITH(apply_tensor_parallel(*gpt, {a, a}), Catch::Contains("device cpu:1 is listed twice"));
  GPTConfig pruned = tp_config();
  pruned.mlp_hidden = {64, 63};
  auto odd = gpt_on(a, pruned);
  CHECK_THROWS_WITH(apply_tensor_parallel(*odd, {a, b}),
                    Catch::Contains("layer 1 has an MLP width of 63 (d_ff), not divisible by 2 devices"));
  CHECK_FALSE(is_tensor_parallel(*gpt));
  CHECK(gpt->h->at<Block>(0)->attn->c_attn->weight.device() == a);  // nothing moved
  CHECK_THROWS_WITH(gather_tensor_parallel(*gpt, kCPU), Catch::Contains("not split with --split tensor"));
}
