// GPT: named configurations and JSON, parameter counts and names (HF GPT-2's), GPT-2
// initialisation, meta shapes, forward / loss / every parameter gradient against PyTorch
// (tests/gen_model_fixtures.py), loading a Hugging Face checkpoint (tests/gen_gpt2_fixture.py),
// KV-cached generation against uncached decoding, a training step that lowers the loss, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/safetensors.h"
#include "models/gpt.h"
#include "optim/adam.h"
#include "test_helpers.h"

using namespace mg;

namespace {

const std::string kFixtures = MG_FIXTURE_DIR;

// A fixture file split into the model's tensors and the "fixture." entries (prefix removed).
struct Fixture {
  std::map<std::string, Tensor> weights, data;
};

Fixture load_fixture(const std::string& file) {
  Fixture f;
  for (auto& [name, t] : load_safetensors(kFixtures + "/" + file)) {
    if (name.rfind("fixture.", 0) == 0) f.data[name.substr(8)] = t;
    else f.weights[name] = t;
  }
  return f;
}

// The weights cast to `dtype` (floating ones only), ready for load_state_dict.
std::map<std::string, Tensor> cast_all(const std::map<std::string, Tensor>& w, DType dtype) {
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : w) out[n] = is_floating(t.dtype()) ? cast(t, dtype) : t;
  return out;
}

// The tiny configuration of gpt_tiny.safetensors.
GPTConfig tiny_config() { return {.vocab_size = 50, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 16}; }

Tensor tokens(const std::vector<int64_t>& v, Shape shape, Device device = kCPU) {
  return from_vector(v, shape, TensorOptions{.dtype = DType::i64, .device = device});
}

double stddev(const Tensor& t) {
  auto v = t.to_double_vector();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

}  // namespace

TEST_CASE("gpt: named configurations, padding and JSON", "[gpt]") {
  GPTConfig mini = GPTConfig::named("gpt-mini");
  CHECK(mini.vocab_size == 256);
  CHECK(mini.context == 128);
  CHECK(mini.n_layer == 4);
  CHECK(mini.padded_vocab() == 256);
  GPTConfig small = GPTConfig::named("gpt-small");
  CHECK((small.context == 256 && small.n_layer == 8 && small.n_head == 8 && small.d_model == 512));
  GPTConfig big = GPTConfig::named("gpt2-124m");
  CHECK((big.vocab_size == 50257 && big.context == 1024 && big.n_layer == 12 && big.d_model == 768));
  CHECK(big.padded_vocab() == 50304);
  CHECK(tiny_config().padded_vocab() == 128);
  CHECK_THROWS_WITH(GPTConfig::named("gpt-huge"), Catch::Contains("unknown configuration 'gpt-huge'") &&
                                                      Catch::Contains("gpt-mini, gpt-small, gpt2-124m"));
  GPTConfig c = GPTConfig::from_json(nlohmann::json{{"n_layer", 3}, {"dropout", 0.1}});
  CHECK((c.n_layer == 3 && c.dropout == 0.1 && c.d_model == 256));
  GPTConfig back = GPTConfig::from_json(big.to_json());
  CHECK(back.to_json() == big.to_json());
  CHECK_THROWS_WITH(GPTConfig::from_json(nlohmann::json{{"n_layers", 3}}), Catch::Contains("unknown key 'n_layers'"));
  CHECK_THROWS_WITH(GPTConfig::from_json(nlohmann::json{{"d_model", 30}, {"n_head", 4}}),
                    Catch::Contains("d_model 30 is not divisible by n_head 4"));
  CHECK_THROWS_WITH(GPTConfig::from_json(nlohmann::json{{"context", "long"}}),
                    Catch::Contains("'context' must be an integer"));
}

TEST_CASE("gpt: parameter counts and Hugging Face names", "[gpt]") {
  // gpt-mini by hand: wte 256*256 + wpe 128*256 + 4 blocks * (2 LN 1024 + c_attn 256*768+768 +
  // c_proj 256*256+256 + c_fc 256*1024+1024 + c_proj 1024*256+256 = 789760) + ln_f 512.
  GPT mini(GPTConfig::named("gpt-mini"), {.device = kMeta});
  CHECK(mini.num_parameters() == 3257856);
  // gpt2-124m: HF's 124,439,808 plus the 47 padding rows of wte (47 * 768 = 36,096).
  GPT big(GPTConfig::named("gpt2-124m"), {.device = kMeta});
  CHECK(big.num_parameters() == 124475904);
  auto named = mini.named_parameters();
  std::vector<std::string> first;
  for (size_t i = 0; i < 14; ++i) first.push_back(named[i].first);
  CHECK(first == std::vector<std::string>{"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                                          "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
                                          "h.0.attn.c_proj.bias", "h.0.ln_2.weight", "h.0.ln_2.bias",
                                          "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight",
                                          "h.0.mlp.c_proj.bias"});
  CHECK(named.back().first == "ln_f.bias");
  CHECK(named.size() == 2 + 4 * 12 + 2);  // the output head is wte: no extra parameter
  CHECK(big.wte->weight.shape() == Shape{50304, 768});
  CHECK(big.h->at<Block>(11)->attn->c_attn->weight.shape() == Shape{2304, 768});
  CHECK(big.h->at<Block>(11)->mlp->c_proj->weight.shape() == Shape{768, 3072});
}

TEST_CASE("gpt: GPT-2 initialisation from a seed, the same stream on meta", "[gpt]") {
  GPTConfig cfg{.vocab_size = 200, .context = 64, .n_layer = 2, .n_head = 2, .d_model = 64};
  Generator g1(7), g2(7), gm(7);
  GPT a(cfg, {.gen = &g1}), b(cfg, {.gen = &g2});
  GPT m(cfg, {.gen = &gm, .device = kMeta});
  CHECK(g1.offset() == gm.offset());
  CHECK(a.wte->weight.to_double_vector() == b.wte->weight.to_double_vector());
  // Embeddings and projections N(0, 0.02^2); residual projections 0.02 / sqrt(2 * n_layer).
  CHECK(stddev(narrow(a.wte->weight.detach(), 0, 0, 200)) == Approx(0.02).epsilon(0.05));
  CHECK(stddev(a.h->at<Block>(0)->attn->c_attn->weight) == Approx(0.02).epsilon(0.05));
  CHECK(stddev(a.h->at<Block>(1)->mlp->c_proj->weight) == Approx(0.01).epsilon(0.05));
  CHECK(stddev(a.h->at<Block>(0)->attn->c_proj->weight) == Approx(0.01).epsilon(0.05));
  // Padding rows, biases zero; LayerNorm 1 / 0.
  for (double v : narrow(a.wte->weight.detach(), 0, 200, 56).to_double_vector()) REQUIRE(v == 0.0);
  for (double v : a.h->at<Block>(0)->mlp->c_fc->bias.to_double_vector()) REQUIRE(v == 0.0);
  for (double v : a.ln_f->weight.to_double_vector()) REQUIRE(v == 1.0);
  CHECK(a.wte->weight.storage()->category() == MemoryCategory::parameter);
}

TEST_CASE("gpt: a meta forward gives the logits shape and allocates", "[gpt]") {
  GPT mini(GPTConfig::named("gpt-mini"), {.device = kMeta});
  Tensor idx = empty({8, 128}, {.dtype = DType::i64, .device = kMeta});
  Tensor logits = mini.forward(idx);
  CHECK(logits.shape() == Shape{8, 128, 256});
  CHECK(logits.is_meta());
  Tensor loss = mini.loss(idx, idx);
  CHECK(loss.dim() == 0);
  backward(loss);
  CHECK(mini.wte->weight.grad().shape() == Shape{256, 256});
  GPT big(GPTConfig::named("gpt2-124m"), {.device = kMeta});
  CHECK(big.forward(empty({1, 32}, {.dtype = DType::i64, .device = kMeta})).shape() == Shape{1, 32, 50257});
}

TEST_CASE("gpt: forward, loss and every gradient match PyTorch (f64)", "[gpt]") {
  Fixture f = load_fixture("gpt_tiny.safetensors");
  GPT model(tiny_config(), {.dtype = DType::f64});
  model.load_state_dict(f.weights);  // strict: the names are memgrad's = HF's
  Tensor idx = f.data.at("idx"), targets = f.data.at("targets");
  test::check_close(model.forward(idx), f.data.at("logits"), 1e-9, 1e-12);
  Tensor loss = model.loss(idx, targets);
  test::check_close(loss, f.data.at("loss"), 1e-9, 1e-12);
  backward(loss);
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    test::check_close(p.grad(), f.data.at("grad." + name), 1e-9, 1e-12);
  }
  // f32 tracks the f64 reference within f32 precision.
  GPT m32(tiny_config());
  m32.load_state_dict(cast_all(f.weights, DType::f32));
  test::check_close(m32.forward(idx), f.data.at("logits"), 1e-4, 1e-5);
  // bf16 storage (8 mantissa bits): within a few percent of the logits' scale.
  Tensor ref32 = m32.forward(idx);
  m32.to(DType::bf16);
  Tensor l16 = m32.forward(idx);
  CHECK(l16.dtype() == DType::bf16);
  test::check_close(cast(l16, DType::f32), ref32, 5e-2, 5e-2);
}

TEST_CASE("gpt: loads a Hugging Face GPT-2 checkpoint with or without the prefix", "[gpt]") {
  // tests/gen_gpt2_fixture.py: vocab 100 (padded to 128), context 32, 2 layers, 2 heads, d 32.
  GPTConfig cfg{.vocab_size = 100, .context = 32, .n_layer = 2, .n_head = 2, .d_model = 32};
  const std::string path = kFixtures + "/gpt2_hf_tiny.safetensors";
  auto expected = load_safetensors(kFixtures + "/gpt2_hf_tiny_expected.safetensors");
  Tensor idx = expected[0].second, logits = expected[1].second;
  REQUIRE(expected[1].first == "logits");
  GPT m64(cfg, {.dtype = DType::f64});
  m64.load_hf_gpt2(path);
  test::check_close(m64.forward(idx), logits, 1e-9, 1e-12);
  for (double v : narrow(m64.wte->weight.detach(), 0, 100, 28).to_double_vector()) REQUIRE(v == 0.0);

  // The same file without "transformer." and without the mask buffers, into an f32 model.
  NamedTensors stripped;
  for (auto& [name, t] : load_safetensors(path))
    if (name.find(".attn.bias") == std::string::npos && name.find(".attn.masked_bias") == std::string::npos)
      stripped.emplace_back(name.substr(12), t);
  const std::string tmp = (std::filesystem::temp_directory_path() / "mg_test_gpt2_noprefix.safetensors").string();
  save_safetensors(tmp, stripped);
  GPT m32(cfg);
  m32.load_hf_gpt2(tmp);
  std::filesystem::remove(tmp);
  test::check_close(m32.forward(idx), logits, 1e-4, 1e-5);

  // A config that does not match names the file, the keys and both shapes.
  GPTConfig wrong = cfg;
  wrong.n_layer = 3;
  wrong.d_model = 64;
  GPT bad(wrong);
  CHECK_THROWS_WITH(bad.load_hf_gpt2(path), Catch::Contains("gpt2_hf_tiny.safetensors") &&
                                                Catch::Contains("missing 'h.2.ln_1.weight'") &&
                                                Catch::Contains("'h.0.attn.c_attn.weight': the file has (32, 96) f32, "
                                                                "expected (64, 192)"));
  NamedTensors extra = stripped;
  extra.emplace_back("h.0.attn.rotary", zeros({2}));
  CHECK_THROWS_WITH(m32.load_hf_gpt2(extra), Catch::Contains("unexpected tensor 'h.0.attn.rotary'"));
}

TEST_CASE("gpt: gpt2-124m takes Hugging Face's shapes (on meta)", "[gpt]") {
  // The 148 tensors of HF's gpt2 model.safetensors with their shapes, as meta tensors.
  auto meta = [](Shape s) { return empty(s, {.device = kMeta}); };
  NamedTensors hf = {{"wte.weight", meta({50257, 768})}, {"wpe.weight", meta({1024, 768})},
                     {"ln_f.weight", meta({768})},        {"ln_f.bias", meta({768})}};
  for (int l = 0; l < 12; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      hf.emplace_back(p + ln + ".weight", meta({768}));
      hf.emplace_back(p + ln + ".bias", meta({768}));
    }
    hf.emplace_back(p + "attn.bias", meta({1, 1, 1024, 1024}));
    hf.emplace_back(p + "attn.c_attn.weight", meta({768, 2304}));
    hf.emplace_back(p + "attn.c_attn.bias", meta({2304}));
    hf.emplace_back(p + "attn.c_proj.weight", meta({768, 768}));
    hf.emplace_back(p + "attn.c_proj.bias", meta({768}));
    hf.emplace_back(p + "mlp.c_fc.weight", meta({768, 3072}));
    hf.emplace_back(p + "mlp.c_fc.bias", meta({3072}));
    hf.emplace_back(p + "mlp.c_proj.weight", meta({3072, 768}));
    hf.emplace_back(p + "mlp.c_proj.bias", meta({768}));
  }
  GPT big(GPTConfig::named("gpt2-124m"), {.device = kMeta});
  CHECK_NOTHROW(big.load_hf_gpt2(hf, "meta gpt2"));
}

TEST_CASE("gpt: KV-cached generation equals uncached greedy decoding", "[gpt]") {
  GPTConfig cfg{.vocab_size = 40, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32};
  Generator gen(11);
  GPT model(cfg, {.gen = &gen, .dtype = DType::f64});
  const std::vector<int64_t> prompt = {3, 17, 5};
  // Reference: the full forward of the whole sequence, argmax of the last row, token by token.
  std::vector<int64_t> ref = prompt;
  {
    NoGradGuard no_grad;
    for (int i = 0; i < 10; ++i) {
      Tensor logits = model.forward(tokens(ref, {1, int64_t(ref.size())}));
      ref.push_back(argmax(select(select(logits, 0, 0), 0, int64_t(ref.size()) - 1), 0).item<int64_t>());
    }
  }
  CHECK(model.generate(prompt, 10, {.temperature = 0.0}) == ref);
  CHECK(model.generate(prompt, 10, {.top_k = 1}) == ref);
  CHECK(model.generate(prompt, 10, {.temperature = 0.0, .use_kv_cache = false}) == ref);
  // Past the context (3 + 25 > 16): the cache gives way to cropping, still equal to uncached.
  auto long_cached = model.generate(prompt, 25, {.temperature = 0.0});
  auto long_plain = model.generate(prompt, 25, {.temperature = 0.0, .use_kv_cache = false});
  CHECK(long_cached.size() == 28);
  CHECK(long_cached == long_plain);
  // Sampling: one seed gives one sequence with or without the cache; top-k stays in the top k.
  GenerateOptions s{.temperature = 0.9, .top_k = 5, .seed = 42};
  auto a = model.generate(prompt, 12, s);
  CHECK(a == model.generate(prompt, 12, s));
  GenerateOptions s_plain = s;
  s_plain.use_kv_cache = false;
  CHECK(a == model.generate(prompt, 12, s_plain));
  GenerateOptions other = s;
  other.seed = 43;
  other.top_k = 0;
  other.temperature = 2.0;
  CHECK(a != model.generate(prompt, 12, other));
  NoGradGuard no_grad;
  for (size_t i = prompt.size(); i < a.size(); ++i) {
    std::vector<int64_t> prefix(a.begin(), a.begin() + std::ptrdiff_t(i));
    auto row = select(select(model.forward(tokens(prefix, {1, int64_t(i)})), 0, 0), 0, int64_t(i) - 1);
    auto v = row.to_double_vector();
    int64_t larger = 0;
    for (double x : v) larger += x > v[size_t(a[i])];
    CHECK(larger < 5);
  }
  CHECK(model.is_training());  // generate restores the train flag
}

// Counts the bytes that `linear` allocates (its outputs): proportional to the positions computed.
struct LinearBytes : AllocatorObserver {
  int64_t bytes = 0;
  void on_event(const MemoryEvent& e) override {
    if (e.kind == MemoryEvent::Kind::alloc && std::string(e.op) == "linear") bytes += int64_t(e.bytes);
  }
};

TEST_CASE("gpt: the KV cache computes only the new positions", "[gpt]") {
  GPTConfig cfg{.vocab_size = 64, .context = 32, .n_layer = 2, .n_head = 2, .d_model = 64};
  GPT model(cfg);
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  auto measure = [&](bool cache) {
    LinearBytes counter;
    add_allocator_observer(&counter);
    model.generate(prompt, 8, {.temperature = 0.0, .use_kv_cache = cache});
    remove_allocator_observer(&counter);
    return counter.bytes;
  };
  // Cached: 16 prompt positions + 7 single ones; uncached: 16 + 17 + ... + 23 = 156 positions.
  const int64_t cached = measure(true), plain = measure(false);
  INFO("linear bytes: cached " << cached << ", uncached " << plain);
  CHECK(cached > 0);
  CHECK(double(cached) < double(plain) / 4.0);
}

TEST_CASE("gpt: a few AdamW steps on a fixed batch lower the loss", "[gpt]") {
  GPTConfig cfg{.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32};
  Generator gen(3);
  GPT model(cfg, {.gen = &gen});
  std::vector<int64_t> seq(2 * 17);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = int64_t((i * 7 + i / 5) % 32);
  std::vector<int64_t> x, y;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 16; ++t) {
      x.push_back(seq[size_t(b * 17 + t)]);
      y.push_back(seq[size_t(b * 17 + t + 1)]);
    }
  Tensor idx = tokens(x, {2, 16}), targets = tokens(y, {2, 16});
  AdamW opt(weight_decay_groups(model.named_parameters(), 3e-3, 0.01));
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    Tensor loss = model.loss(idx, targets);
    if (step == 0) first = loss.item();
    last = loss.item();
    opt.zero_grad();
    backward(loss);
    opt.step();
  }
  CHECK(first == Approx(std::log(32.0)).epsilon(0.05));  // small init: near-uniform predictions
  CHECK(last < first - 0.3);
}

TEST_CASE("gpt: dropout is active in train mode only", "[gpt]") {
  GPTConfig cfg{.vocab_size = 32, .context = 8, .n_layer = 1, .n_head = 2, .d_model = 16, .dropout = 0.3};
  GPT model(cfg, {.dtype = DType::f64});
  Tensor idx = tokens({1, 2, 3, 4}, {1, 4});
  auto t1 = model.forward(idx).to_double_vector(), t2 = model.forward(idx).to_double_vector();
  CHECK(t1 != t2);
  model.eval();
  CHECK(model.forward(idx).to_double_vector() == model.forward(idx).to_double_vector());
}

TEST_CASE("gpt: gradcheck of a block in f64", "[gpt]") {
  GPTConfig cfg{.vocab_size = 8, .context = 4, .n_layer = 1, .n_head = 2, .d_model = 4};
  GPT model(cfg, {.dtype = DType::f64});
  auto block = model.h->at<Block>(0);
  Tensor x = test::leaf(test::rand_tensor({2, 3, 4}, 5));
  // A transposed (non-contiguous) input as well.
  Tensor xt = test::leaf(test::rand_tensor({2, 4, 3}, 6));
  test::check_gradcheck([&](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x});
  test::check_gradcheck([&](const std::vector<Tensor>& in) { return block->forward(transpose(in[0], 1, 2)); }, {xt});
}

TEST_CASE("gpt: bad inputs name the problem", "[gpt]") {
  GPT model(GPTConfig{.vocab_size = 16, .context = 8, .n_layer = 1, .n_head = 2, .d_model = 8});
  CHECK_THROWS_WITH(model.forward(zeros({1, 9}, {.dtype = DType::i64})),
                    Catch::Contains("sequence length 9 must be in [1, context = 8]"));
  CHECK_THROWS_WITH(model.forward(zeros({1, 4})), Catch::Contains("expected token ids (B, T) of dtype i64 or i32"));
  CHECK_THROWS_WITH(model.forward(zeros({4}, {.dtype = DType::i64})), Catch::Contains("got (4,) i64"));
  CHECK_THROWS_WITH(model.forward(zeros({1, 4}, {.dtype = DType::i64, .device = Device("cpu:1")})),
                    Catch::Contains("token ids are on cpu:1 but the model is on cpu:0"));
  CHECK_THROWS_WITH(model.loss(zeros({1, 4}, {.dtype = DType::i64}), zeros({1, 3}, {.dtype = DType::i64})),
                    Catch::Contains("targets (1, 3) must have the shape of idx (1, 4)"));
  CHECK_THROWS_WITH(model.generate({3, 16}, 2), Catch::Contains("prompt token 16 at position 1"));
  CHECK_THROWS_WITH(model.generate({}, 2), Catch::Contains("the prompt is empty"));
  CHECK_THROWS_WITH(model.generate({1}, 2, {.temperature = -1}), Catch::Contains("temperature must be"));
  GPT meta(GPTConfig{.vocab_size = 16, .context = 8, .n_layer = 1, .n_head = 2, .d_model = 8}, {.device = kMeta});
  CHECK_THROWS_WITH(meta.generate({1}, 2), Catch::Contains("meta device"));
  CHECK_THROWS_WITH(GPT(GPTConfig{.n_head = 3}), Catch::Contains("d_model 256 is not divisible by n_head 3"));
}
