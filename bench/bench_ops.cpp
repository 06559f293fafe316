// Element-wise bandwidth and a small model step: mg::add on 16M floats against memcpy of the
// same bytes (an add reads two buffers and writes one: 3 x 64 MiB per call), and forward +
// backward of a 4-layer MLP (batch 256, width 512) through the whole framework.
#include <benchmark/benchmark.h>

#include <cstring>

#include "autograd/engine.h"
#include "core/tensor.h"
#include "ops/ops.h"

using namespace mg;

namespace {

constexpr int64_t kN = 16 << 20;  // 16M floats = 64 MiB

void BM_memcpy_64MiB(benchmark::State& state) {
  Tensor a = full({kN}, 1.0), c = empty({kN});
  for (auto _ : state) {
    std::memcpy(c.data_ptr(), a.data_ptr(), a.nbytes());
    benchmark::ClobberMemory();
  }
  // memcpy reads 64 MiB and writes 64 MiB.
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * a.nbytes());
}

void BM_add_16M_f32(benchmark::State& state) {
  Tensor a = full({kN}, 1.0), b = full({kN}, 2.0);
  for (auto _ : state) {
    Tensor c = add(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 3 * a.nbytes());
}

void BM_mlp4_forward_backward(benchmark::State& state) {
  const int64_t B = 256, W = 512;
  Generator g(7);
  auto param = [&](Shape s, uint64_t seed) {
    Tensor t = empty(s);
    float* p = t.data<float>();
    Generator gen(seed);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.05f * gen.normal_at(uint64_t(i));
    t.set_requires_grad(true);
    return t;
  };
  std::vector<Tensor> w, bias;
  for (int l = 0; l < 4; ++l) {
    w.push_back(param({W, W}, 10 + l));
    bias.push_back(param({W}, 20 + l));
  }
  Tensor x = param({B, W}, 1).detach();
  Tensor target = zeros({B}, {.dtype = DType::i64});
  for (auto _ : state) {
    Tensor h = x;
    for (int l = 0; l < 4; ++l) h = l < 3 ? relu(linear(h, w[size_t(l)], bias[size_t(l)])) : linear(h, w[size_t(l)], bias[size_t(l)]);
    Tensor loss = cross_entropy(h, target);
    backward(loss);
    for (auto& t : w) t.set_grad(Tensor());
    for (auto& t : bias) t.set_grad(Tensor());
  }
  // 3 GEMMs of 2*B*W*W flops per layer (forward, dinput, dweight).
  state.counters["GFLOP/s"] = benchmark::Counter(double(state.iterations()) * 4 * 3 * 2.0 * B * W * W / 1e9,
                                                 benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_memcpy_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_add_16M_f32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mlp4_forward_backward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
