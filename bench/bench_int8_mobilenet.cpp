// MobileNetV2-32 inference at batch 64: fp32 (BatchNorm as `vision eval` runs it), fp32 with the
// BatchNorms folded, and the int8 model (PTQ, calibrated on two random batches) on each int8 path
// this CPU has (ops/int8_isa.h; 1 AVX2, 2 AVX-512 VNNI), random weights. Besides images/s each run
// reports where the time goes: stem (f32 3x3 conv on int8 weights), the 17 inverted-residual
// blocks, head (last 1x1 conv, pooling, classifier), in ms per batch.
// Run the cases interleaved, so load from other processes hits them alike, and read the medians:
//   build/release/bench/bench_int8_mobilenet --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <memory>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "models/compress/quant_convert.h"
#include "models/mobilenet_v2.h"
#include "models/nn/init.h"
#include "ops/int8_isa.h"
#include "ops/ops.h"

namespace {

constexpr int64_t kBatch = 64;

mg::Tensor random_images(uint64_t seed) {
  mg::Tensor t = mg::empty({kBatch, 3, 32, 32});
  mg::Generator g(seed);
  mg::uniform_(t, -1.0, 1.0, g);
  return t;
}

// The model of `mode` (0 fp32, 1 fp32 folded, 2 int8) at width `width`/100, built once.
std::shared_ptr<mg::MobileNetV2> model(int64_t width, int64_t mode) {
  static std::map<std::pair<int64_t, int64_t>, std::shared_ptr<mg::MobileNetV2>> cache;
  auto& m = cache[{width, mode}];
  if (m) return m;
  mg::NoGradGuard ng;
  mg::Generator g(7);
  m = std::make_shared<mg::MobileNetV2>(
      mg::MobileNetV2Config{.width_mult = double(width) / 100, .num_classes = 10, .small_input = true, .dropout = 0.0,
                            .input_size = 32},
      mg::InitOptions{.gen = &g});
  uint64_t seed = 100;
  for (auto& [name, mod] : m->named_modules())  // BatchNorm statistics as a trained model has them
    if (auto* bn = dynamic_cast<mg::BatchNorm2d*>(mod)) {
      mg::Generator gb(seed++);
      mg::uniform_(bn->weight, 0.5, 1.5, gb);
      mg::uniform_(bn->bias, -0.2, 0.2, gb);
      mg::uniform_(bn->running_var, 0.5, 2.0, gb);
    }
  m->eval();
  if (mode >= 1) mg::fold_batch_norms(*m);
  if (mode == 2) {
    mg::prepare_ptq(*m, {});
    for (uint64_t s : {1, 2}) (*m)(random_images(s));
    mg::convert_ptq(*m);
  }
  return m;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// args: width x 100, mode (0 fp32, 1 fp32 folded, 2 int8 AVX2, 3 int8 AVX-512 VNNI)
void BM_MobileNetV2(benchmark::State& state) {
  const int64_t width = state.range(0), mode = state.range(1);
  const mg::Int8Isa isa = mode == 3 ? mg::Int8Isa::avx512vnni : mg::Int8Isa::avx2;
  if (mode >= 2 && int(isa) > int(mg::int8_isa_supported())) {
    state.SkipWithError("this CPU lacks the int8 path");
    return;
  }
  const mg::Int8Isa before = mg::int8_isa();
  if (mode >= 2) mg::set_int8_isa(isa);
  auto net = model(width, std::min<int64_t>(mode, 2));
  const mg::Tensor x = random_images(3);
  mg::NoGradGuard ng;
  const mg::Sequential& fs = *net->features;
  double stem = 0, blocks = 0, head = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    mg::Tensor f = (*fs[0])(x);
    stem += ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (size_t i = 1; i + 1 < fs.size(); ++i) f = (*fs[i])(f);
    blocks += ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    f = (*net->classifier)(mg::global_avg_pool2d((*fs[fs.size() - 1])(f)));
    head += ms_since(t0);
    benchmark::DoNotOptimize(f.data_ptr());
  }
  const double n = double(state.iterations());
  state.counters["images/s"] = benchmark::Counter(double(kBatch) * n, benchmark::Counter::kIsRate);
  state.counters["stem_ms"] = stem / n;
  state.counters["blocks_ms"] = blocks / n;
  state.counters["head_ms"] = head / n;
  state.SetLabel(mode == 0 ? "fp32" : mode == 1 ? "fp32 folded" : std::string("int8 ") + mg::int8_isa_name(isa));
  mg::set_int8_isa(before);
}

BENCHMARK(BM_MobileNetV2)->ArgsProduct({{50, 100}, {0, 1, 2, 3}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
