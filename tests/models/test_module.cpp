// Module machinery: dotted names in registration order, tied weights listed once, train/eval,
// state_dict round trips through a safetensors file (values copied into the existing storage),
// strict-load errors naming key and shapes, to(DType)/to(Device) in place, zero_grad freeing
// gradient memory, parameter memory tagged as such, and the module path seen inside forward.
// Memory assertions use devices of their own (cpu:12, cpu:13) so other tests cannot disturb them.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/safetensors.h"
#include "models/nn/layers.h"
#include "test_helpers.h"

using namespace mg;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mg_module_" + std::to_string(::getpid()) + "_" + name)).string();
}

// Records the profiler's module path whenever its forward runs.
class PathProbe : public UnaryModule {
 public:
  PathProbe() : UnaryModule("PathProbe") {}
  Tensor forward(const Tensor& x) override {
    auto scope = forward_scope();
    seen = current_module_path();
    return x;
  }
  std::string seen;
};

// A block with raw parameters and a buffer of its own, plus children.
class TestBlock : public Module {
 public:
  explicit TestBlock(const InitOptions& init) : Module("TestBlock") {
    scale = register_parameter("scale", full({3}, 2.0, {.device = init.device}));
    count = register_buffer("count", zeros({}, {.dtype = DType::i64, .device = init.device}));
    norm = register_module("norm", std::make_shared<LayerNorm>(3, 1e-5, true, init));
    fc = register_module("fc", std::make_shared<Linear>(3, 4, true, init));
  }
  Tensor scale, count;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> fc;
};

class Net : public Module {
 public:
  explicit Net(uint64_t seed, Device device = kCPU) : Module("Net"), gen(seed) {
    InitOptions init{.gen = &gen, .device = device};
    embed = register_module("embed", std::make_shared<Embedding>(5, 3, 1.0, init));
    h = register_module("h", std::make_shared<ModuleList>());
    h->push_back(std::make_shared<TestBlock>(init));
    h->push_back(std::make_shared<TestBlock>(init));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4, 1e-5, 0.1, init));
    // Tied: the head reuses the embedding table (listed once by named_parameters).
    head = register_module("head", std::make_shared<Module>("Head"));
    head_weight = head->register_parameter("weight", embed->weight);
  }
  Generator gen;
  std::shared_ptr<Embedding> embed;
  std::shared_ptr<ModuleList> h;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Module> head;
  Tensor head_weight;
};

std::vector<std::string> names_of(const NamedTensors& ts) {
  std::vector<std::string> out;
  for (const auto& [n, _] : ts) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("module: dotted names in registration order, tied weights once", "[module]") {
  Net net(1);
  const std::vector<std::string> expected = {
      "embed.weight",  "h.0.scale",    "h.0.norm.weight", "h.0.norm.bias", "h.0.fc.weight", "h.0.fc.bias",
      "h.1.scale",     "h.1.norm.weight", "h.1.norm.bias", "h.1.fc.weight", "h.1.fc.bias",   "bn.weight",
      "bn.bias"};
  CHECK(names_of(net.named_parameters()) == expected);
  CHECK(names_of(net.named_buffers()) ==
        std::vector<std::string>{"h.0.count", "h.1.count", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  // 15 + 2 * (3 + 3 + 3 + 12 + 4) + 4 + 4
  CHECK(net.num_parameters() == 15 + 2 * 25 + 8);
  CHECK(net.parameters().size() == expected.size());
  for (const auto& p : net.parameters()) CHECK(p.requires_grad());

  // The state dict keeps every name (the tied one too), parameters before buffers per module.
  auto sd = names_of(net.state_dict());
  CHECK(sd.size() == expected.size() + 5 + 1);
  CHECK(sd.front() == "embed.weight");
  CHECK(sd.back() == "head.weight");

  auto mods = net.named_modules();
  REQUIRE(mods.size() == 1 + 1 + 1 + 2 * 3 + 1 + 1);
  CHECK(mods[0].first == "");
  CHECK(mods[3].first == "h.0");
  CHECK(mods[4].first == "h.0.norm");
  CHECK(mods[3].second->type_name() == "TestBlock");
  CHECK(net.h->at<TestBlock>(1)->fc->out_features == 4);
  CHECK_THROWS_WITH(net.h->at<Linear>(0), Catch::Contains("element 0 is a TestBlock"));
}

TEST_CASE("module: bad registrations are errors naming the member", "[module]") {
  Module m("Thing");
  m.register_parameter("w", zeros({2}));
  CHECK_THROWS_WITH(m.register_parameter("w", zeros({2})), Catch::Contains("'w' is already registered"));
  CHECK_THROWS_WITH(m.register_buffer("a.b", zeros({2})), Catch::Contains("invalid member name 'a.b'"));
  CHECK_THROWS_WITH(m.register_parameter("i", zeros({2}, {.dtype = DType::i64})), Catch::Contains("must be floating"));
  CHECK_THROWS_WITH(m.register_module("c", std::shared_ptr<Linear>()), Catch::Contains("'c' is null"));
}

TEST_CASE("module: train and eval reach every descendant", "[module]") {
  Net net(1);
  CHECK(net.bn->is_training());
  net.eval();
  for (auto& [_, m] : net.named_modules()) CHECK_FALSE(m->is_training());
  net.train();
  for (auto& [_, m] : net.named_modules()) CHECK(m->is_training());
}

TEST_CASE("module: forward scopes give the profiler dotted module paths", "[module]") {
  Module top("Top");
  auto h = top.register_module("h", std::make_shared<ModuleList>());
  auto seq = h->push_back(std::make_shared<Sequential>());
  auto probe = seq->push_back(std::make_shared<PathProbe>());
  auto later = std::make_shared<PathProbe>();
  // A probe added to a list that is itself registered late still gets the full path.
  auto list2 = std::make_shared<ModuleList>();
  list2->push_back(later);
  top.register_module("blocks", list2);
  seq->forward(zeros({1}));
  CHECK(probe->seen == "h.0.0");
  later->forward(zeros({1}));
  CHECK(later->seen == "blocks.0");
  CHECK(current_module_path().empty());
}

TEST_CASE("module: state_dict round trip through a safetensors file", "[module]") {
  Net a(1), b(2);
  // Make a's buffers non-trivial too.
  fill_(a.bn->running_mean, 0.25);
  fill_(a.h->at<TestBlock>(0)->count, 7);
  const std::string path = temp_path("roundtrip.safetensors");
  a.save(path);
  // The file holds every state_dict name with PyTorch's metadata.
  CHECK(load_safetensors_metadata(path).at("format") == "pt");
  CHECK(load_safetensors(path).size() == a.state_dict().size());

  // Loading copies into b's existing storage: same addresses before and after.
  std::vector<void*> before;
  for (auto& [_, t] : b.state_dict()) before.push_back(t.data_ptr());
  LoadResult r = b.load(path);
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  auto sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sa[i].second.to_double_vector() == sb[i].second.to_double_vector());
    CHECK(sb[i].second.data_ptr() == before[i]);
    CHECK(sb[i].second.dtype() == sa[i].second.dtype());
  }
  CHECK(b.h->at<TestBlock>(0)->count.item<int64_t>() == 7);
  CHECK(b.embed->weight.requires_grad());
  std::filesystem::remove(path);
}

TEST_CASE("module: strict loading names the key and both shapes", "[module]") {
  Linear fc(4, 3);
  std::map<std::string, Tensor> good{{"weight", zeros({3, 4})}, {"bias", zeros({3})}};
  CHECK_NOTHROW(fc.load_state_dict(good));
  CHECK(fc.weight.to_double_vector() == std::vector<double>(12, 0.0));

  Tensor w = test::rand_tensor({3, 4}, 5, DType::f32);
  copy_(fc.weight, w);
  auto wrong_shape = good;
  wrong_shape["weight"] = zeros({4, 3});
  CHECK_THROWS_WITH(fc.load_state_dict(wrong_shape),
                    Catch::Contains("key 'weight': (4, 3) f32 in the state dict vs (3, 4) f32 in the model"));
  auto wrong_dtype = good;
  wrong_dtype["bias"] = zeros({3}, {.dtype = DType::f64});
  CHECK_THROWS_WITH(fc.load_state_dict(wrong_dtype), Catch::Contains("key 'bias': (3,) f64 in the state dict vs (3,) f32"));
  auto missing = good;
  missing.erase("bias");
  CHECK_THROWS_WITH(fc.load_state_dict(missing), Catch::Contains("missing key 'bias' (model has (3,) f32)"));
  auto extra = good;
  extra["scale"] = zeros({1});
  CHECK_THROWS_WITH(fc.load_state_dict(extra), Catch::Contains("unexpected key 'scale'"));
  // A failed load writes nothing.
  CHECK(fc.weight.to_double_vector() == w.to_double_vector());

  // Non-strict: reports missing and unexpected keys, still refuses a shape mismatch.
  auto both = missing;
  both["scale"] = zeros({1});
  LoadResult r = fc.load_state_dict(both, /*strict=*/false);
  CHECK(r.missing_keys == std::vector<std::string>{"bias"});
  CHECK(r.unexpected_keys == std::vector<std::string>{"scale"});
  CHECK(fc.weight.to_double_vector() == std::vector<double>(12, 0.0));
  CHECK_THROWS_WITH(fc.load_state_dict(wrong_shape, false), Catch::Contains("(4, 3) f32 in the state dict vs (3, 4)"));
}

TEST_CASE("module: to(DType) casts in place and keeps integer buffers", "[module]") {
  Net net(3);
  Tensor handle = net.h->at<TestBlock>(0)->fc->weight;  // a handle taken before the cast
  const std::vector<double> f32_values = handle.to_double_vector();
  net.to(DType::bf16);
  for (auto& [n, p] : net.named_parameters()) {
    INFO(n);
    CHECK(p.dtype() == DType::bf16);
    CHECK(p.requires_grad());
    CHECK(p.storage()->category() == MemoryCategory::parameter);
  }
  CHECK(net.bn->running_var.dtype() == DType::bf16);
  CHECK(net.bn->num_batches_tracked.dtype() == DType::i64);
  CHECK(net.h->at<TestBlock>(1)->count.dtype() == DType::i64);
  // The old handle sees the cast (same TensorImpl), values within bf16's precision.
  CHECK(handle.dtype() == DType::bf16);
  test::check_values(handle, f32_values, 1e-2, 1e-3);
  // Tied weights stay tied.
  CHECK(net.head_weight.is_same(net.embed->weight));
  net.to(DType::f64);
  CHECK(net.embed->weight.dtype() == DType::f64);
  CHECK_THROWS_WITH(net.to(DType::i32), Catch::Contains("floating dtype"));
}

TEST_CASE("module: to(Device) moves parameters, buffers and gradients", "[module]") {
  const Device dev("cpu:13");
  Linear fc(4, 8);
  fc.weight.set_grad(ones({8, 4}));
  const auto w = fc.weight.to_double_vector();
  const int64_t before = memory_stats(dev).category(MemoryCategory::parameter).current;
  fc.to(dev);
  CHECK(fc.weight.device() == dev);
  CHECK(fc.bias.device() == dev);
  CHECK(fc.weight.grad().device() == dev);
  CHECK(fc.weight.requires_grad());
  CHECK(fc.weight.to_double_vector() == w);
  CHECK(memory_stats(dev).category(MemoryCategory::parameter).current - before >= int64_t(fc.weight.nbytes() + fc.bias.nbytes()));
  fc.to(kCPU);
  CHECK(memory_stats(dev).category(MemoryCategory::parameter).current == before);
  CHECK(memory_stats(dev).category(MemoryCategory::gradient).current == 0);
}

TEST_CASE("module: parameters are tagged parameter, zero_grad frees gradient memory", "[module]") {
  const Device dev("cpu:12");
  const int64_t p0 = memory_stats(dev).category(MemoryCategory::parameter).current;
  {
    Generator gen(7);
    Sequential mlp({std::make_shared<Linear>(4, 16, true, InitOptions{.gen = &gen, .device = dev}), std::make_shared<ReLU>(),
                    std::make_shared<Linear>(16, 2, true, InitOptions{.gen = &gen, .device = dev})});
    int64_t bytes = 0;
    for (auto& p : mlp.parameters()) {
      CHECK(p.storage()->category() == MemoryCategory::parameter);
      bytes += int64_t(p.nbytes());
    }
    CHECK(memory_stats(dev).category(MemoryCategory::parameter).current - p0 >= bytes);
    // A tensor made elsewhere (here: an activation) is re-homed as parameter memory.
    Tensor act = mul(ones({3}, {.device = dev}), 2.0);
    REQUIRE(act.storage()->category() == MemoryCategory::activation);
    Tensor reg = mlp.register_parameter("extra", act);
    CHECK(reg.storage()->category() == MemoryCategory::parameter);

    Tensor x = test::rand_tensor({5, 4}, 1, DType::f32, -1, 1, dev);
    backward(sum(mlp.forward(x)));
    CHECK(memory_stats(dev).category(MemoryCategory::gradient).current > 0);
    CHECK(mlp[0]->parameters()[0].grad().defined());
    mlp.zero_grad();
    CHECK(memory_stats(dev).category(MemoryCategory::gradient).current == 0);
    for (auto& p : mlp.parameters()) CHECK_FALSE(p.grad().defined());
  }
  CHECK(memory_stats(dev).category(MemoryCategory::parameter).current == p0);
}

TEST_CASE("module: a model built on meta has every byte and no data", "[module]") {
  Generator g1(11), g2(11);
  Linear on_meta(64, 32, true, {.gen = &g1, .device = kMeta});
  Linear on_cpu(64, 32, true, {.gen = &g2});
  CHECK(on_meta.weight.is_meta());
  CHECK(on_meta.weight.shape() == Shape{32, 64});
  // Same generator positions reserved on both devices.
  CHECK(g1.offset() == g2.offset());
  CHECK(on_meta.forward(empty({7, 64}, {.device = kMeta})).shape() == Shape{7, 32});
  // A state dict loads onto meta as a shape check only.
  CHECK_NOTHROW(on_meta.load_state_dict(on_cpu.state_dict()));
}
