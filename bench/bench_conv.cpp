// conv2d on the three convolutions of a MobileNetV2 inverted-residual block at batch 16, 32x32
// (the mobilenetv2-32 workload's shape): 1x1 expand 32 -> 192, 3x3 depthwise 192 (padding 1),
// 1x1 project 192 -> 32. Each conv is timed forward only and forward + backward (dx, dW, db),
// and the whole block (expand -> depthwise -> project) forward + backward. Reports ms per call
// and GFLOP/s, counting 2 * N * Cout * OH * OW * Cin/groups * KH * KW per forward and twice
// that for the backward (dx and dW), as cuDNN and PyTorch's profiler do.
// BM_DepthwiseSmall: the 3x3 depthwise convs of mobilenetv2-32 at batch 64 (16x16 x 192,
// 8x8 x 576, 4x4 x 960 channels, stride 1), each under the plane-by-plane reference kernel and
// under the channel-vectorised one (ops/conv2d_depthwise.h), so one run gives before and after;
// in f32 and in bf16 (whose staged f32 images run the same kernels).
// BM_PointwiseSmall: the expand + project 1x1 pair of mobilenetv2-32 at batch 64 on each plane
// size (32x32: 24 <-> 144, 16x16: 32 <-> 192, 8x8: 96 <-> 576, 4x4: 160 <-> 960 channels), forward
// and backward, in f32 and bf16: one image's GEMM has a plane's positions as its columns, few on
// small planes.
// Run: OMP_NUM_THREADS=2 build/<dir>/bench/bench_conv --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/tensor.h"
#include "ops/conv2d_depthwise.h"
#include "ops/ops.h"

namespace {

constexpr int64_t kBatch = 16, kSize = 32, kIn = 32, kHidden = 192;

struct ConvSpec {
  int64_t cin, cout, k, groups;
  double flops() const {  // forward
    return 2.0 * double(kBatch * cout * kSize * kSize) * double(cin / groups * k * k);
  }
};
const ConvSpec kExpand{kIn, kHidden, 1, 1}, kDepthwise{kHidden, kHidden, 3, kHidden}, kProject{kHidden, kIn, 1, 1};

mg::Tensor filled(const mg::Shape& s, double scale, double freq) {
  mg::Tensor t = mg::empty(s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(scale * std::sin(freq * double(i) + 0.1));
  return t;
}

// Operands of one conv: x (16, cin, 32, 32), weight (cout, cin/groups, k, k), bias (cout).
struct ConvOperands {
  explicit ConvOperands(const ConvSpec& c)
      : spec(c),
        x(filled({kBatch, c.cin, kSize, kSize}, 1.0, 0.37)),
        w(filled({c.cout, c.cin / c.groups, c.k, c.k}, 1.0 / std::sqrt(double(c.cin / c.groups * c.k * c.k)), 0.23)),
        b(filled({c.cout}, 0.1, 0.5)),
        dout(filled({kBatch, c.cout, kSize, kSize}, 1.0, 0.71)) {}
  mg::Tensor run() const { return mg::conv2d(x, w, b, {1, spec.k / 2, spec.groups}); }
  ConvSpec spec;
  mg::Tensor x, w, b, dout;
};

void set_counters(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * 1e-9 * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

enum class Pass : int64_t { forward = 0, forward_backward = 1 };

void run_conv(benchmark::State& state, const ConvSpec& spec) {
  const Pass pass = Pass(state.range(0));
  ConvOperands op(spec);
  if (pass == Pass::forward) {
    mg::NoGradGuard no_grad;
    for (auto _ : state) benchmark::DoNotOptimize(op.run().data_ptr());
    set_counters(state, spec.flops());
    return;
  }
  op.x.set_requires_grad(true);
  op.w.set_requires_grad(true);
  op.b.set_requires_grad(true);
  for (auto _ : state) {
    for (const mg::Tensor* t : {&op.x, &op.w, &op.b}) t->set_grad(mg::Tensor());
    mg::backward(op.run(), op.dout);
    benchmark::DoNotOptimize(op.w.grad().data_ptr());
  }
  set_counters(state, 3.0 * spec.flops());
}

void BM_ConvExpand1x1(benchmark::State& state) { run_conv(state, kExpand); }
void BM_ConvDepthwise3x3(benchmark::State& state) { run_conv(state, kDepthwise); }
void BM_ConvProject1x1(benchmark::State& state) { run_conv(state, kProject); }

// expand -> depthwise -> project, forward + backward; x and all weights need gradients.
void BM_BlockForwardBackward(benchmark::State& state) {
  ConvOperands e(kExpand), d(kDepthwise), p(kProject);
  mg::Tensor x = e.x.set_requires_grad(true);
  for (ConvOperands* o : {&e, &d, &p}) {
    o->w.set_requires_grad(true);
    o->b.set_requires_grad(true);
  }
  for (auto _ : state) {
    x.set_grad(mg::Tensor());
    for (ConvOperands* o : {&e, &d, &p}) {
      o->w.set_grad(mg::Tensor());
      o->b.set_grad(mg::Tensor());
    }
    mg::Tensor h = mg::conv2d(x, e.w, e.b, {1, 0, 1});
    h = mg::conv2d(h, d.w, d.b, {1, 1, kHidden});
    h = mg::conv2d(h, p.w, p.b, {1, 0, 1});
    mg::backward(h, p.dout);
    benchmark::DoNotOptimize(e.w.grad().data_ptr());
  }
  set_counters(state, 3.0 * (kExpand.flops() + kDepthwise.flops() + kProject.flops()));
}

// Args: plane side (16, 8 or 4), pass, kernel (0 reference, 1 channel lanes), dtype (0 f32, 1
// bf16: staged in f32 groups of images).
void BM_DepthwiseSmall(benchmark::State& state) {
  const int64_t side = state.range(0), n = 64, c = side == 16 ? 192 : side == 8 ? 576 : 960;
  const Pass pass = Pass(state.range(1));
  mg::detail::set_depthwise_kernel(state.range(2) ? mg::detail::DepthwiseKernel::automatic
                                                  : mg::detail::DepthwiseKernel::reference);
  const mg::DType dt = state.range(3) ? mg::DType::bf16 : mg::DType::f32;
  mg::Tensor x = mg::cast(filled({n, c, side, side}, 1.0, 0.37), dt);
  mg::Tensor w = mg::cast(filled({c, 1, 3, 3}, 0.3, 0.23), dt);
  mg::Tensor dout = mg::cast(filled({n, c, side, side}, 1.0, 0.71), dt);
  const double flops = 2.0 * double(n * c * side * side) * 9.0;
  if (pass == Pass::forward) {
    mg::NoGradGuard no_grad;
    for (auto _ : state) benchmark::DoNotOptimize(mg::conv2d(x, w, mg::Tensor(), {1, 1, c}).data_ptr());
    set_counters(state, flops);
  } else {
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    for (auto _ : state) {
      x.set_grad(mg::Tensor());
      w.set_grad(mg::Tensor());
      mg::backward(mg::conv2d(x, w, mg::Tensor(), {1, 1, c}), dout);
      benchmark::DoNotOptimize(w.grad().data_ptr());
    }
    set_counters(state, 3.0 * flops);
  }
  mg::detail::set_depthwise_kernel(mg::detail::DepthwiseKernel::automatic);
}

// Args: plane side (32, 16, 8 or 4), dtype (0 f32, 1 bf16).
void BM_PointwiseSmall(benchmark::State& state) {
  const int64_t side = state.range(0), n = 64;
  const int64_t narrow = side == 32 ? 24 : side == 16 ? 32 : side == 8 ? 96 : 160, wide = 6 * narrow;
  const mg::DType dt = state.range(1) ? mg::DType::bf16 : mg::DType::f32;
  auto make = [&](const mg::Shape& s, double scale, double freq) { return mg::cast(filled(s, scale, freq), dt); };
  mg::Tensor x = make({n, narrow, side, side}, 1.0, 0.37).set_requires_grad(true);
  mg::Tensor we = make({wide, narrow, 1, 1}, 0.2, 0.23).set_requires_grad(true);
  mg::Tensor wp = make({narrow, wide, 1, 1}, 0.1, 0.29).set_requires_grad(true);
  const mg::Tensor dout = make({n, narrow, side, side}, 1.0, 0.71);
  for (auto _ : state) {
    for (const mg::Tensor* t : {&x, &we, &wp}) t->set_grad(mg::Tensor());
    mg::backward(mg::conv2d(mg::conv2d(x, we, mg::Tensor(), {}), wp, mg::Tensor(), {}), dout);
    benchmark::DoNotOptimize(we.grad().data_ptr());
  }
  set_counters(state, 3.0 * 2.0 * 2.0 * double(n * side * side) * double(narrow * wide));
}

}  // namespace

// Arg 0: forward only (no_grad); 1: forward + backward.
BENCHMARK(BM_ConvExpand1x1)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ConvDepthwise3x3)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ConvProject1x1)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DepthwiseSmall)
    ->ArgsProduct({{16, 8, 4}, {0, 1}, {0, 1}, {0, 1}})
    ->ArgNames({"side", "backward", "lanes", "bf16"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_PointwiseSmall)
    ->ArgsProduct({{32, 16, 8, 4}, {0, 1}})
    ->ArgNames({"side", "bf16"})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_BlockForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
