// AdamW8bit: the dynamic maps (bitsandbytes' layout), nearest-code rounding, optimizer-state
// bytes at least 70% below AdamW's (allocator, category optimizer_state), the loss tracking
// AdamW's on a small regression problem, a saved-and-resumed run continuing bit for bit, small
// tensors kept in f32, and state-file errors.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "models/nn/layers.h"
#include "optim/adamw8bit.h"
#include "test_helpers.h"

using namespace mg;

namespace {

// x (B, 64) -> (B, 10): Linear(64, 128) -> GELU -> Linear(128, 10); the first weight (8192
// elements) gets 8-bit state, the rest is small.
struct Net {
  explicit Net(uint64_t seed, Device dev = kCPU) : gen(seed) {
    fc1 = std::make_shared<Linear>(64, 128, true, InitOptions{.gen = &gen, .device = dev});
    fc2 = std::make_shared<Linear>(128, 10, true, InitOptions{.gen = &gen, .device = dev});
  }
  NamedTensors params() const {
    NamedTensors p;
    for (auto& [n, t] : fc1->named_parameters()) p.emplace_back("fc1." + n, t);
    for (auto& [n, t] : fc2->named_parameters()) p.emplace_back("fc2." + n, t);
    return p;
  }
  Tensor forward(const Tensor& x) { return fc2->forward(gelu_tanh(fc1->forward(x))); }
  Generator gen;
  std::shared_ptr<Linear> fc1, fc2;
};

// One step on a fixed batch i of a teacher problem; returns the loss.
double train_step(Net& net, Optimizer& opt, int64_t i) {
  Tensor x = test::rand_tensor({32, 64}, 100 + uint64_t(i % 8), DType::f32);
  Tensor y = test::rand_tensor({32, 10}, 200 + uint64_t(i % 8), DType::f32, -0.5, 0.5);
  Tensor loss = mse_loss(net.forward(x), y);
  backward(loss);
  opt.step();
  opt.zero_grad();
  return loss.item();
}

std::vector<double> values(const Net& net) {
  std::vector<double> v;
  for (auto& [n, t] : net.params()) {
    auto x = t.to_double_vector();
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

}  // namespace

TEST_CASE("AdamW8bit: dynamic maps and nearest-code rounding", "[adam8bit]") {
  const auto& s = AdamW8bit::dynamic_map(true);
  const auto& u = AdamW8bit::dynamic_map(false);
  CHECK(std::is_sorted(s.begin(), s.end()));
  CHECK(std::is_sorted(u.begin(), u.end()));
  CHECK(s.back() == 1.f);
  CHECK(u.back() == 1.f);
  CHECK(u.front() == 0.f);
  CHECK(s.front() < -0.99f);
  CHECK(std::count(s.begin(), s.end(), 0.f) == 1);
  CHECK(std::count(u.begin(), u.end(), 0.f) == 1);
  // the smallest positive codes are 1e-6-scale (dynamic exponent), not 1/255 (linear)
  CHECK(*std::upper_bound(u.begin(), u.end(), 0.f) < 1e-6f);
  for (float x : {-1.f, -0.3f, -1e-5f, 0.f, 2e-7f, 0.01f, 0.5f, 0.999f, 1.f}) {
    const uint8_t c = AdamW8bit::quantize_code(x, /*is_signed=*/true);
    for (float code : s) CHECK(std::abs(code - x) >= std::abs(s[c] - x));
  }
}

TEST_CASE("AdamW8bit: the indexed code search equals the binary search on every kind of float", "[adam8bit]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> xs{0.f, -0.f, 1.f, -1.f, 1e-30f, -1e-30f, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()};
  for (bool is_signed : {true, false})  // every code, and the floats on either side of it
    for (float c : AdamW8bit::dynamic_map(is_signed))
      for (float x : {c, std::nextafter(c, 2.f), std::nextafter(c, -2.f)}) xs.push_back(x);
  for (int i = 0; i < 300000; ++i) {
    xs.push_back(unit(rng));                        // what the update quantizes: x / absmax
    xs.push_back(std::bit_cast<float>(bits(rng)));  // any bit pattern (NaN included)
  }
  int64_t differ = 0;
  for (bool is_signed : {true, false})
    for (float x : xs)
      if (AdamW8bit::quantize_code(x, is_signed) != AdamW8bit::quantize_code_ref(x, AdamW8bit::dynamic_map(is_signed))) {
        ++differ;
        UNSCOPED_INFO("differs at " << x << " (bits " << std::bit_cast<uint32_t>(x) << ")");
      }
  CHECK(differ == 0);
}

TEST_CASE("AdamW8bit: optimizer state at least 70% smaller than AdamW's (allocator)", "[adam8bit]") {
  auto state_bytes = [](bool eight_bit) {
    const Device dev("cpu:7");
    const int64_t before = memory_stats(dev).category(MemoryCategory::optimizer_state).current;
    Generator gen(1);
    Linear a(512, 256, true, {.gen = &gen, .device = dev}), b(256, 64, true, {.gen = &gen, .device = dev});
    NamedTensors p = a.named_parameters();
    for (auto& [n, t] : b.named_parameters()) p.emplace_back("b." + n, t);
    std::unique_ptr<Optimizer> opt;
    if (eight_bit) opt = std::make_unique<AdamW8bit>(p, 1e-3);
    else opt = std::make_unique<AdamW>(p, 1e-3);
    for (auto& [n, t] : p) {
      MemoryCategoryGuard g(MemoryCategory::gradient);
      t.set_grad(full(t.shape(), 0.1, {.device = dev}));
    }
    opt->step();
    return memory_stats(dev).category(MemoryCategory::optimizer_state).current - before;
  };
  const int64_t f32 = state_bytes(false), q8 = state_bytes(true);
  INFO("AdamW " << f32 << " bytes, AdamW8bit " << q8 << " bytes");
  CHECK(q8 <= int64_t(0.3 * double(f32)));
  CHECK(q8 > 0);
}

TEST_CASE("AdamW8bit: the loss tracks AdamW's on a small problem", "[adam8bit]") {
  Net a(7), b(7);
  AdamW ref(weight_decay_groups(a.params(), 3e-3, 0.01));
  AdamW8bit q(weight_decay_groups(b.params(), 3e-3, 0.01));
  double first = 0, la = 0, lb = 0;
  for (int64_t i = 0; i < 200; ++i) {
    la = train_step(a, ref, i);
    lb = train_step(b, q, i);
    if (i == 0) first = la;
  }
  INFO("first " << first << ", AdamW " << la << ", AdamW8bit " << lb);
  CHECK(la < 0.5 * first);  // the problem is learned
  CHECK(std::abs(lb - la) <= 0.05 * la);
  CHECK(values(a) != values(b));  // and the state really is quantized
  CHECK(q.state("fc1.weight")->tensors[0].second.dtype() == DType::u8);
  CHECK(q.state("fc1.weight")->tensors[1].second.shape() == Shape{4});  // 8192 / 2048 blocks
  CHECK(q.state("fc2.weight")->tensors[0].first == "exp_avg");       // 1280 < 4096: f32
}

TEST_CASE("AdamW8bit: save and resume continue bit for bit", "[adam8bit]") {
  Net a(3);
  AdamW8bit opt(weight_decay_groups(a.params(), 1e-2, 0.01));
  for (int64_t i = 0; i < 5; ++i) train_step(a, opt, i);
  const NamedTensors saved_state = [&] {
    NamedTensors s;
    for (auto& [n, t] : opt.state_dict()) s.emplace_back(n, clone(t));
    return s;
  }();
  const auto meta = opt.state_metadata();
  Net b(99);
  {
    NoGradGuard ng;
    auto pa = a.params(), pb = b.params();
    for (size_t i = 0; i < pa.size(); ++i) copy_(pb[i].second, pa[i].second);
  }
  AdamW8bit resumed(weight_decay_groups(b.params(), 1e-2, 0.01));
  resumed.load_state_dict(saved_state, meta);
  for (int64_t i = 5; i < 10; ++i) {
    train_step(a, opt, i);
    train_step(b, resumed, i);
  }
  CHECK(values(a) == values(b));
  for (auto& [name, t] : opt.state_dict()) {
    const std::string& n = name;  // clang 14 cannot capture a structured binding
    auto other = resumed.state_dict();
    auto it = std::find_if(other.begin(), other.end(), [&](auto& kv) { return kv.first == n; });
    REQUIRE(it != other.end());
    CHECK(t.to_double_vector() == it->second.to_double_vector());
  }
}

TEST_CASE("AdamW8bit: state-file and parameter errors", "[adam8bit]") {
  Net a(3);
  AdamW plain(a.params(), 1e-3);
  train_step(a, plain, 0);
  AdamW8bit q(a.params(), 1e-3);
  CHECK_THROWS_WITH(q.load_state_dict(plain.state_dict(), plain.state_metadata()), Catch::Contains("saved by AdamW"));
  train_step(a, q, 0);
  NamedTensors bad = q.state_dict();
  for (auto& [n, t] : bad)
    if (n == "fc1.weight.exp_avg_absmax") t = zeros({3});
  CHECK_THROWS_WITH(q.load_state_dict(bad, q.state_metadata()), Catch::Contains("fc1.weight.exp_avg_absmax"));
  Tensor p16 = full({8}, 1.0, {.dtype = DType::bf16});
  p16.set_requires_grad(true);
  CHECK_THROWS_WITH(AdamW8bit(NamedTensors{{"w", p16}}, 1e-3), Catch::Contains("f32 parameters"));
}
