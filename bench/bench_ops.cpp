// Element-wise bandwidth and a small model step: mg::add on 16M floats against memcpy of the
// same bytes (an add reads two buffers and writes one: 3 x 64 MiB per call), GELU-tanh forward
// and backward on a GPT-mini-sized activation (8 x 128 x 1024, f32 and bf16: the transcendental
// math and the 16-bit load/store paths), and forward + backward of a 4-layer MLP (batch 256,
// width 512) through the whole framework.
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

// (B, T, 4C) = (8, 128, 1024) activation, values ~ N(0, 2^2) so both tails of GELU are hit.
Tensor gelu_input(DType dtype) {
  Tensor t = empty({8, 128, 1024});
  float* p = t.data<float>();
  Generator gen(3);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 2.0f * gen.normal_at(uint64_t(i));
  return cast(t, dtype);
}

void BM_gelu_tanh_forward(benchmark::State& state, DType dtype) {
  Tensor x = gelu_input(dtype);
  for (auto _ : state) {
    Tensor y = gelu_tanh(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * x.numel());
}

// Times backward only: GeluTanhBackward (dx = dout * gelu'(x)); the forward runs untimed.
void BM_gelu_tanh_backward(benchmark::State& state, DType dtype) {
  Tensor x = gelu_input(dtype);
  x.set_requires_grad(true);
  Tensor dout = cast(full(x.shape(), 0.5), dtype);
  for (auto _ : state) {
    state.PauseTiming();
    Tensor y = gelu_tanh(x);
    state.ResumeTiming();
    backward(y, dout);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    state.PauseTiming();
    x.set_grad(Tensor());
    y = Tensor();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * x.numel());
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
BENCHMARK_CAPTURE(BM_gelu_tanh_forward, f32, DType::f32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gelu_tanh_forward, bf16, DType::bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gelu_tanh_forward, f16, DType::f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gelu_tanh_backward, f32, DType::f32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gelu_tanh_backward, bf16, DType::bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gelu_tanh_backward, f16, DType::f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mlp4_forward_backward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
