// CPU-vs-CUDA agreement of fake quantization (ops/cuda/fake_quantize.cu): the same inputs on cpu:0
// and cuda:0 give the same bits for the forward and the input's straight-through gradient, fixed
// and learned scales, per tensor and per channel, on values clamped below and above the grid and
// on exact ties (round half to even). The learned scale's gradient is a sum whose order differs
// within a chunk (Note [LSQ sum order] in fake_quantize.cu): it agrees to 2 f32 ulps plus
// 1e-11 * grad_factor * sum |dout * g|, and equals itself bit for bit from run to run. Runs when
// MG_TEST_DEVICE=cuda and a GPU is present (scripts/gpu-check); otherwise each case says why not.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "ops/fake_quantize.h"
#include "ops/fake_quantize_learned.h"
#include "ops/kernels/fake_quantize.h"
#include "ops/ops.h"
#include "cuda_skip.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;
using test::require_same_bits;

namespace {

const Device kGPU(DeviceType::cuda, 0);

// How many elements of x (f32, cpu) fall below and above [qmin, qmax] with scale s_c for dim 0's
// channel c and zero point z, with the op's own x / s (a division, or a product with 1 / s).
struct Clamped {
  int below = 0, above = 0;
};
Clamped count_clamped(const Tensor& x, const Tensor& scales, fq::Grid q, fq::ScaleDivision d) {
  const auto xv = x.to_vector<float>(), sv = scales.to_vector<float>();
  const size_t inner = xv.size() / sv.size();
  Clamped n;
  for (size_t i = 0; i < xv.size(); ++i) {
    const float s = sv[i / inner];
    const float r = fq::round_even(fq::scaled(xv[i], s, 1.f / s, d)) + q.zero;
    n.below += r < q.qmin;
    n.above += r > q.qmax;
  }
  return n;
}

// Per channel c: sum over its elements of |dout * g| (g the LSQ coefficient), in f64: the scale of
// the rounding error any order of the scale gradient's f64 sum can make.
std::vector<double> abs_term_sums(const Tensor& x, const Tensor& dout, const Tensor& scales, fq::Grid q,
                                  fq::ScaleDivision d) {
  const auto xv = x.to_vector<float>(), gv = dout.to_vector<float>(), sv = scales.to_vector<float>();
  const size_t inner = xv.size() / sv.size();
  std::vector<double> sums(sv.size(), 0.0);
  for (size_t i = 0; i < xv.size(); ++i) {
    const float s = sv[i / inner];
    bool inside;
    sums[i / inner] += std::fabs(double(gv[i] * fq::lsq_coefficient(xv[i], s, 1.f / s, q, d, inside)));
  }
  return sums;
}

// The CUDA scale gradient against the CPU's within Note [LSQ sum order]'s bound.
void check_scale_grad(const Tensor& cpu, const Tensor& cuda, const std::vector<double>& abs_sums, double grad_factor) {
  const auto a = cpu.to_vector<float>(), b = to(cuda, kCPU).to_vector<float>();
  REQUIRE(a.size() == abs_sums.size());
  REQUIRE(b.size() == a.size());
  for (size_t c = 0; c < a.size(); ++c) {
    INFO("channel " << c << ": cpu " << a[c] << " cuda " << b[c] << " sum |t| " << abs_sums[c]);
    const double tol = 2.4e-7 * std::fabs(double(a[c])) + 1e-11 * grad_factor * abs_sums[c];
    CHECK(std::isfinite(b[c]));
    CHECK(std::fabs(double(a[c]) - double(b[c])) <= tol);
  }
}

// x (C, inner) with the first elements of rows [0, rows) on exact ties of the grid, (k + 1/2) * s
// for a power-of-two s, so nearbyint's half-to-even rounding shows (127.5 rounds to 128: clamped).
Tensor with_ties(const Tensor& x, float s, int64_t rows) {
  std::vector<double> v = x.to_double_vector();
  const double ties[] = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 127.5, -127.5};
  const size_t inner = size_t(x.numel() / x.size(0));
  for (size_t c = 0; c < size_t(rows); ++c)
    for (size_t k = 0; k < std::size(ties) && k < inner; ++k) v[c * inner + k] = ties[k] * s;
  return from_vector(v, x.shape(), {.dtype = x.dtype()});
}

struct LearnedRun {
  Tensor out, dx, dscale;
};

// fake_quantize_learned_* on device d from cpu values; dx / dscale only where asked.
LearnedRun run_learned(const Tensor& x, const Tensor& scale, const Tensor& dout, Device d, bool per_tensor,
                       int32_t zero, double grad_factor, bool want_dx = true, bool want_dscale = true) {
  Tensor xd = to(x, d), sd = to(scale, d);
  if (want_dx) xd = test::leaf(xd.detach());
  if (want_dscale) sd = test::leaf(sd.detach());
  Tensor out = per_tensor ? fake_quantize_learned_per_tensor(xd, sd, zero, grad_factor)
                          : fake_quantize_learned_per_channel(xd, sd, grad_factor);
  backward(out, to(dout, d));
  return {out, want_dx ? xd.grad() : Tensor(), want_dscale ? sd.grad() : Tensor()};
}

}  // namespace

TEST_CASE("cuda agreement: fake_quantize_per_channel forward and STE gradient bit for bit", "[cuda][quant]") {
  MG_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{6, 3, 3, 3}, Shape{5, 1000}, Shape{3, 9}}) {
    INFO("shape " << shape_str(shape));
    const Tensor base = rand_tensor(shape, 11, DType::f32, -0.7, 0.9);
    // half the max: the largest values clamp on both sides; channel 0 on a power-of-two step, with ties
    std::vector<double> sv = mul(per_channel_scales(base), 0.5).to_double_vector();
    sv[0] = 1.0 / 256;
    const Tensor s = from_vector(sv, {shape[0]}, {.dtype = DType::f32});
    const Tensor w = with_ties(base, 1.f / 256, 1);
    const Clamped n = count_clamped(w, s, {.qmin = -127.f, .qmax = 127.f, .zero = 0.f}, fq::ScaleDivision::exact);
    CHECK((n.below > 0 && n.above > 0));
    const Tensor dout = rand_tensor(shape, 12, DType::f32, -1, 1);
    Tensor outs[2], grads[2];
    const Device devices[2] = {kCPU, kGPU};
    for (int k = 0; k < 2; ++k) {
      Tensor x = test::leaf(to(w, devices[k]).detach());
      outs[k] = fake_quantize_per_channel(x, to(s, devices[k]));
      backward(outs[k], to(dout, devices[k]));
      grads[k] = x.grad();
    }
    CHECK(outs[1].device() == kGPU);
    require_same_bits("forward", outs[0], outs[1]);
    require_same_bits("dx", grads[0], grads[1]);
    // no gradient wanted: no mask, the same values
    require_same_bits("forward without grad", outs[0], fake_quantize_per_channel(to(w, kGPU), to(s, kGPU)));
  }
}

TEST_CASE("cuda agreement: fake_quantize_per_tensor forward and STE gradient bit for bit", "[cuda][quant]") {
  MG_REQUIRE_CUDA();
  for (const ActivationQParams& q :
       {choose_qparams_u8(-1.f, 2.5f), ActivationQParams{.scale = 1.f / 32, .zero_point = 100}}) {
    INFO("scale " << q.scale << " zero point " << q.zero_point);
    // [-4, 5] overflows both ends of either grid ([-1, 2.5] and [-3.125, 4.84]); with the scale 1/32
    // (x * 32 exact) the first elements of each row are exact ties
    const Tensor x = with_ties(rand_tensor({4, 5, 77}, 21, DType::f32, -4, 5), q.scale, 4);
    const Clamped n = count_clamped(reshape(x, {-1}), full({1}, q.scale, {.dtype = DType::f32}),
                                    {.qmin = 0.f, .qmax = 255.f, .zero = float(q.zero_point)},
                                    fq::ScaleDivision::by_inverse);
    CHECK((n.below > 0 && n.above > 0));
    const Tensor dout = rand_tensor({4, 5, 77}, 22, DType::f32, -1, 1);
    Tensor outs[2], grads[2];
    const Device devices[2] = {kCPU, kGPU};
    for (int k = 0; k < 2; ++k) {
      Tensor xd = test::leaf(to(x, devices[k]).detach());
      outs[k] = fake_quantize_per_tensor(xd, q);
      backward(outs[k], to(dout, devices[k]));
      grads[k] = xd.grad();
    }
    require_same_bits("forward", outs[0], outs[1]);
    require_same_bits("dx", grads[0], grads[1]);
  }
  // a bf16 input: cast to f32, fake-quantized, cast back, on both devices alike
  const Tensor xb = cast(rand_tensor({3, 50}, 23, DType::f32, -2, 2), DType::bf16);
  const ActivationQParams q = choose_qparams_u8(-1.f, 1.f);
  require_same_bits("bf16 forward", fake_quantize_per_tensor(xb, q), fake_quantize_per_tensor(to(xb, kGPU), q));
}

TEST_CASE("cuda agreement: learned per-tensor fake quantization: forward and dx bit for bit, dscale to sum order",
          "[cuda][quant][qat]") {
  MG_REQUIRE_CUDA();
  const fq::ScaleDivision d = fq::ScaleDivision::by_inverse;
  // 40000 elements: three partial-sum chunks, the last one short; 7: one short chunk
  for (const Shape& shape : {Shape{8, 5000}, Shape{7}}) {
    INFO("shape " << shape_str(shape));
    const ActivationQParams q = choose_qparams_u8(-1.f, 2.f);
    const Tensor x = rand_tensor(shape, 31, DType::f32, -2.5, 4);
    const Tensor scale = full({1}, q.scale, {.dtype = DType::f32});
    const Tensor dout = rand_tensor(shape, 32, DType::f32, -1, 1);
    const double grad_factor = 1.0 / std::sqrt(double(x.numel()) * 255.0);
    const fq::Grid grid{.qmin = 0.f, .qmax = 255.f, .zero = float(q.zero_point)};
    if (x.numel() > 100) {
      const Clamped n = count_clamped(reshape(x, {-1}), scale, grid, d);
      CHECK((n.below > 0 && n.above > 0));
    }
    const LearnedRun cpu = run_learned(x, scale, dout, kCPU, true, q.zero_point, grad_factor);
    const LearnedRun gpu = run_learned(x, scale, dout, kGPU, true, q.zero_point, grad_factor);
    require_same_bits("forward", cpu.out, gpu.out);
    require_same_bits("dx", cpu.dx, gpu.dx);
    check_scale_grad(cpu.dscale, gpu.dscale, abs_term_sums(reshape(x, {-1}), reshape(dout, {-1}), scale, grid, d),
                     grad_factor);
    // the same bits on every run, and with only the scale learning (no dx written)
    const LearnedRun again = run_learned(x, scale, dout, kGPU, true, q.zero_point, grad_factor);
    require_same_bits("dscale run to run", gpu.dscale, again.dscale);
    const LearnedRun scale_only = run_learned(x, scale, dout, kGPU, true, q.zero_point, grad_factor, false, true);
    CHECK_FALSE(scale_only.dx.defined());
    require_same_bits("dscale without dx", gpu.dscale, scale_only.dscale);
    const LearnedRun x_only = run_learned(x, scale, dout, kGPU, true, q.zero_point, grad_factor, true, false);
    CHECK_FALSE(x_only.dscale.defined());
    require_same_bits("dx without dscale", cpu.dx, x_only.dx);
  }
}

TEST_CASE("cuda agreement: learned per-channel fake quantization: forward and dx bit for bit, dscale to sum order",
          "[cuda][quant][qat]") {
  MG_REQUIRE_CUDA();
  const fq::ScaleDivision d = fq::ScaleDivision::exact;
  const fq::Grid grid{.qmin = -127.f, .qmax = 127.f, .zero = 0.f};
  // small channels (a conv's), and channels of 20000: two partial-sum chunks each, the second short
  for (const Shape& shape : {Shape{7, 3, 3, 3}, Shape{3, 20000}}) {
    INFO("shape " << shape_str(shape));
    const Tensor w = rand_tensor(shape, 41, DType::f32, -0.6, 0.8);
    const Tensor s = mul(per_channel_scales(w), 0.6);  // clamps the largest values on both sides
    const Tensor dout = rand_tensor(shape, 42, DType::f32, -1, 1);
    const double grad_factor = 1.0 / std::sqrt(double(w.numel() / shape[0]) * 127.0);
    const Clamped n = count_clamped(w, s, grid, d);
    CHECK((n.below > 0 && n.above > 0));
    const LearnedRun cpu = run_learned(w, s, dout, kCPU, false, 0, grad_factor);
    const LearnedRun gpu = run_learned(w, s, dout, kGPU, false, 0, grad_factor);
    require_same_bits("forward", cpu.out, gpu.out);
    require_same_bits("dx", cpu.dx, gpu.dx);
    const Tensor w2 = reshape(w, {shape[0], -1}), g2 = reshape(dout, {shape[0], -1});
    check_scale_grad(cpu.dscale, gpu.dscale, abs_term_sums(w2, g2, s, grid, d), grad_factor);
    const LearnedRun again = run_learned(w, s, dout, kGPU, false, 0, grad_factor);
    require_same_bits("dscale run to run", gpu.dscale, again.dscale);
    const LearnedRun scale_only = run_learned(w, s, dout, kGPU, false, 0, grad_factor, false, true);
    require_same_bits("dscale without dx", gpu.dscale, scale_only.dscale);
  }
  // a bad scale on cuda:0 is the CPU's error (the scales are read on the host)
  const Tensor x = to(rand_tensor({3, 8}, 43, DType::f32, -2, 2), kGPU);
  const Tensor bad = to(from_vector(std::vector<double>{0.1, -0.2, 0.1}, {3}, {.dtype = DType::f32}), kGPU);
  CHECK_THROWS_WITH(fake_quantize_learned_per_channel(x, bad, 0.1), Catch::Contains("scale 1 is -0.2"));
  CHECK_THROWS_WITH(fake_quantize_per_channel(x, bad), Catch::Contains("scale 1 is -0.2"));
}
