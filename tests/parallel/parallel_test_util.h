// Helpers for the model-parallel tests: tiny models built from a seed on any device, one
// forward/backward with the default generator reseeded (so dropout draws the same masks), and
// bit-for-bit comparison of losses and every parameter gradient between two runs.
#pragma once
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <string>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "test_helpers.h"

namespace mg::test {

// 4 blocks, dropout on every branch (masks must match between runs).
inline GPTConfig tiny_gpt_config(double dropout = 0.1) {
  return {.vocab_size = 40, .context = 16, .n_layer = 4, .n_head = 2, .d_model = 16, .dropout = dropout};
}

inline std::shared_ptr<GPT> tiny_gpt(Device d, double dropout = 0.1) {
  Generator gen(7);
  return std::make_shared<GPT>(tiny_gpt_config(dropout), InitOptions{.gen = &gen, .device = d});
}

inline Tensor random_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed, Device d) {
  Generator g(seed);
  std::vector<int64_t> v(size_t(B * T));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(g.bits_at(i) % uint32_t(vocab));
  return from_vector(v, {B, T}, TensorOptions{.dtype = DType::i64, .device = d});
}

// Every parameter's gradient on the host, by name, and the loss.
struct StepResult {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

inline StepResult collect(const Module& m, const Tensor& loss) {
  StepResult r;
  r.loss = to(loss.detach(), kCPU).item<double>();
  for (const auto& [n, p] : m.named_parameters()) {
    REQUIRE(p.grad().defined());
    CHECK(p.grad().device() == p.device());  // each gradient lives with its parameter
    r.grads[n] = to(p.grad(), kCPU).to_double_vector();
  }
  return r;
}

// One GPT forward/backward on the batch (tokens made on wte's device), dropout seeded.
inline StepResult gpt_step(GPT& gpt, uint64_t seed = 11) {
  const Device d = gpt.wte->weight.device();
  Tensor idx = random_tokens(2, 12, gpt.config().vocab_size, seed, d);
  Tensor tgt = random_tokens(2, 12, gpt.config().vocab_size, seed + 1, d);
  manual_seed(1234);
  Tensor loss = gpt.loss(idx, tgt);
  backward(loss);
  return collect(gpt, loss);
}

// Same loss and the same bits in every gradient.
inline void check_identical(const StepResult& a, const StepResult& b) {
  CHECK(a.loss == b.loss);
  REQUIRE(a.grads.size() == b.grads.size());
  for (const auto& [n, g] : a.grads) {
    INFO("gradient of " << n);
    REQUIRE(b.grads.count(n));
    const auto& h = b.grads.at(n);
    REQUIRE(g.size() == h.size());
    CHECK(std::memcmp(g.data(), h.data(), g.size() * sizeof(double)) == 0);
  }
}

}  // namespace mg::test
