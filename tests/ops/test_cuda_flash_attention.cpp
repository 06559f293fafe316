// The flash attention kernels on cuda:0 (ops/cuda/flash_attention.cu) against the CPU's flash path
// (ops/flash_attention.cpp) from the same values: the output within 1e-5 relative in f32, the saved
// row log-sum-exp within 1e-5, the gradients within 1e-4 relative (plus 1e-5 of the largest: their
// sums over T run in another order), f64 within 1e-10, bf16/f16 within two roundings; causal or
// not, T below, at and across the 64-row tile, head sizes up to 128; dropout dropping exactly the
// weights of the Philox rule (checked element by element, on the cpu too); bit-identical
// gradients run to run (no atomics); and memory: what is saved is O(B NH T), the same bytes per
// category as on the cpu, 10x below the math path at T = 1024 and 2048. The cuda cases run when
// MG_TEST_DEVICE=cuda and a GPU is present (scripts/gpu-check); otherwise each says why not.
#include <catch2/catch.hpp>
#include <algorithm>
#include <any>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/saved_tensor.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "cuda_skip.h"
#include "test_helpers.h"

using namespace mg;
using Catch::Matchers::Contains;
using test::leaf;
using test::rand_tensor;

namespace {

const Device kGPU(DeviceType::cuda, 0);

struct Result {
  Tensor out, lse, dq, dk, dv;  // on the cpu
  std::vector<Shape> saved;     // the shapes the node saved, in order
};

// One forward + backward of scaled_dot_product_attention on `dev`, q, k, v made as a model makes
// them ((B, T, NH, HS) leaves viewed as (B, NH, T, HS)), dropout from a generator at offset 7.
Result run(Device dev, const Shape& bthd, DType dt, bool causal, double p, uint64_t seed) {
  Tensor q = leaf(rand_tensor(bthd, seed, dt, -1, 1, dev)), k = leaf(rand_tensor(bthd, seed + 1, dt, -1, 1, dev));
  Tensor v = leaf(rand_tensor(bthd, seed + 2, dt, -1, 1, dev));
  Generator g(123);
  g.advance(7);
  std::vector<Tensor> saved;
  Tensor out;
  {
    SavedTensorHooksGuard hooks({.pack = [&](const Tensor& t) -> std::any {
                                   saved.push_back(t);
                                   return t;
                                 },
                                 .unpack = [](const std::any& a) { return std::any_cast<Tensor>(a); }});
    out = scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2), transpose(v, 1, 2), causal, p, &g);
  }
  REQUIRE(saved.size() == 5);  // q, k, v, out, lse
  Result r;
  for (const Tensor& t : saved) {
    CHECK(t.device() == dev);
    r.saved.push_back(t.shape());
  }
  r.lse = to(saved[4], kCPU);
  backward(out, rand_tensor(out.shape(), seed + 3, dt, -1, 1, dev));
  r.out = to(out.detach(), kCPU);
  r.dq = to(q.grad(), kCPU);
  r.dk = to(k.grad(), kCPU);
  r.dv = to(v.grad(), kCPU);
  return r;
}

struct Tol {
  double rtol, atol;  // atol: a fraction of the reference's largest magnitude
};

// got within tol of ref (both on the cpu): |got - ref| <= atol * max(1, max |ref|) + rtol |ref|.
void check_near(const char* what, const Tensor& got, const Tensor& ref, Tol tol) {
  INFO(what);
  REQUIRE(got.shape() == ref.shape());
  REQUIRE(got.dtype() == ref.dtype());
  const std::vector<double> a = got.to_double_vector(), b = ref.to_double_vector();
  double amax = 1;
  for (double x : b) amax = std::max(amax, std::abs(x));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) <= tol.atol * amax + tol.rtol * std::abs(b[i])) continue;
    FAIL_CHECK("element " << i << ": cuda " << a[i] << " vs cpu " << b[i]);
    return;
  }
}

// Output and lse at `out`, gradients at `grad`; the lse is in the compute dtype (f32 for 16-bit).
void check_agree(const Result& got, const Result& ref, Tol out, Tol lse, Tol grad) {
  CHECK(got.saved == ref.saved);
  check_near("out", got.out, ref.out, out);
  check_near("lse", got.lse, ref.lse, lse);
  check_near("dq", got.dq, ref.dq, grad);
  check_near("dk", got.dk, ref.dk, grad);
  check_near("dv", got.dv, ref.dv, grad);
}

constexpr Tol kF32Out{1e-5, 1e-6}, kF32Grad{1e-4, 1e-5};

// With q = k = 0 every weight row i may use is 1/L (L = i + 1 when causal, else T), and with
// v = the identity (HS = T) out[s][i][j] = z(s, i, j) / L: the weights dropout kept show as
// non-zeros, which must be exactly those of the rule kept iff uniform(seed, offset + (s*T + i)*T + j) >= p.
void check_dropout_mask(Device dev, int64_t T, bool causal) {
  INFO("T " << T << " causal " << causal << " on " << dev.str());
  const int64_t NH = 2;
  const double p = 0.4;
  std::vector<double> eye(size_t(NH * T * T), 0.0);
  for (int64_t s = 0; s < NH; ++s)
    for (int64_t j = 0; j < T; ++j) eye[size_t((s * T + j) * T + j)] = 1.0;
  Tensor zero = zeros({1, NH, T, T}, {.device = dev});
  Tensor v = from_vector(eye, {1, NH, T, T}, {.device = dev});
  Generator g(77);
  g.advance(5);  // not a multiple of Philox's 4 words
  const uint64_t offset = g.offset();
  const Tensor out_t = scaled_dot_product_attention(zero, zero, v, causal, p, &g);
  const std::vector<double> out = to(out_t, kCPU).to_double_vector();
  const Generator ref(77);
  int64_t kept = 0, usable = 0;
  for (int64_t s = 0; s < NH; ++s)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        const double L = causal ? double(i + 1) : double(T), got = out[size_t((s * T + i) * T + j)];
        const bool masked = causal && j > i;
        const bool keep = !masked && ref.uniform_at(offset + uint64_t((s * T + i) * T + j)) >= float(p);
        const double want = keep ? 1.0 / (1.0 - p) / L : 0.0;
        kept += keep;
        usable += !masked;
        if (std::abs(got - want) <= 1e-6 * std::abs(want)) continue;
        FAIL_CHECK("weight (" << s << ", " << i << ", " << j << "): " << got << ", the rule says " << want);
        return;
      }
  CHECK(kept > usable * 4 / 10);  // about 60% kept: the test sees a real mask
  CHECK(kept < usable * 8 / 10);
}

// Bytes of n f32 values in the allocator's 512-byte blocks.
int64_t bytes_of(int64_t n) { return (n * 4 + 511) / 512 * 512; }

// Peak bytes one causal forward + backward adds beyond its inputs, output and gradients (as in
// tests/ops/test_flash_attention.cpp).
int64_t own_peak(bool flash, int64_t B, int64_t NH, int64_t T, int64_t HS, Device dev) {
  const Shape s{B, NH, T, HS};
  Tensor q = leaf(empty(s, {.device = dev})), k = leaf(empty(s, {.device = dev})), v = leaf(empty(s, {.device = dev}));
  Tensor dout = empty(s, {.device = dev});
  for (const Tensor& t : {q, k, v, dout}) fill_(t, 0.25);
  const int64_t base = memory_stats(dev).allocated.current;
  reset_peak_stats(dev);
  {
    Tensor out = flash ? scaled_dot_product_attention(q, k, v, true) : scaled_dot_product_attention_math(q, k, v, true);
    backward(out, dout);
  }
  return memory_stats(dev).allocated.peak - base - 4 * bytes_of(B * NH * T * HS);  // out, dq, dk, dv
}

// What a recorded forward leaves allocated on `dev`, per category: what the node saved.
std::vector<int64_t> saved_bytes_by_category(Device dev, const Shape& s) {
  Tensor q = leaf(rand_tensor(s, 1, DType::f32, -1, 1, dev)), k = leaf(rand_tensor(s, 2, DType::f32, -1, 1, dev));
  Tensor v = leaf(rand_tensor(s, 3, DType::f32, -1, 1, dev));
  std::vector<int64_t> before, after;
  for (size_t c = 0; c < kNumMemoryCategories; ++c)
    before.push_back(memory_stats(dev).category(MemoryCategory(c)).current);
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  for (size_t c = 0; c < kNumMemoryCategories; ++c)
    after.push_back(memory_stats(dev).category(MemoryCategory(c)).current - before[c]);
  return after;
}

}  // namespace

TEST_CASE("flash attention's dropout keeps exactly the weights of the Philox rule on the cpu", "[attention][flash]") {
  for (int64_t T : {40, 100})
    for (bool causal : {true, false}) check_dropout_mask(kCPU, T, causal);
}

TEST_CASE("cuda flash attention keeps exactly the dropout weights of the Philox rule as the cpu", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (int64_t T : {40, 100})
    for (bool causal : {true, false}) check_dropout_mask(kGPU, T, causal);
}

TEST_CASE("cuda flash attention equals the cpu flash path in f32 for T around the tile", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (int64_t T : {1, 17, 64, 65, 130, 200}) {
    for (int64_t HS : {16, 64}) {
      for (bool causal : {true, false}) {
        INFO("T " << T << " HS " << HS << " causal " << causal);
        const Shape s{2, T, 3, HS};
        check_agree(run(kGPU, s, DType::f32, causal, 0.0, 10), run(kCPU, s, DType::f32, causal, 0.0, 10), kF32Out,
                    kF32Out, kF32Grad);
      }
    }
  }
  // Head sizes that fill no lane evenly (5), and the largest kernels (100 and 128 of at most 128).
  for (int64_t HS : {5, 100, 128}) {
    INFO("HS " << HS);
    const Shape s{1, 97, 2, HS};
    check_agree(run(kGPU, s, DType::f32, true, 0.0, 20), run(kCPU, s, DType::f32, true, 0.0, 20), kF32Out, kF32Out,
                kF32Grad);
  }
}

TEST_CASE("cuda flash attention with dropout equals the cpu flash path from the same generator", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (int64_t T : {40, 130}) {
    for (bool causal : {true, false}) {
      INFO("T " << T << " causal " << causal);
      const Shape s{2, T, 3, 32};
      check_agree(run(kGPU, s, DType::f32, causal, 0.3, 30), run(kCPU, s, DType::f32, causal, 0.3, 30), kF32Out,
                  kF32Out, kF32Grad);
    }
  }
}

TEST_CASE("cuda flash attention on bf16 and f16 inputs computes in f32 as the cpu does", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (DType dt : {DType::bf16, DType::f16}) {
    for (double p : {0.0, 0.2}) {
      INFO(dtype_name(dt) << " dropout " << p);
      const Shape s{2, 77, 2, 64};
      // Outputs and gradients are rounded to dt from f32 values that differ in their last bits:
      // a rounding apart at most. The lse stays f32.
      const Tol low = dt == DType::bf16 ? Tol{2e-2, 4e-3} : Tol{4e-3, 1e-3};
      Result got = run(kGPU, s, dt, true, p, 40), ref = run(kCPU, s, dt, true, p, 40);
      CHECK(got.lse.dtype() == DType::f32);
      check_agree(got, ref, low, kF32Out, low);
    }
  }
}

TEST_CASE("cuda flash attention equals the cpu flash path in f64", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    const Shape s{1, 70, 2, 24};
    const Tol f64{1e-10, 1e-12};
    check_agree(run(kGPU, s, DType::f64, causal, 0.1, 50), run(kCPU, s, DType::f64, causal, 0.1, 50), f64, f64, f64);
  }
}

TEST_CASE("cuda flash attention gives the same bits on every run and equals the cuda math path", "[cuda]") {
  MG_REQUIRE_CUDA();
  const Shape s{2, 150, 2, 64};
  Result a = run(kGPU, s, DType::f32, true, 0.1, 60), b = run(kGPU, s, DType::f32, true, 0.1, 60);
  const std::vector<std::pair<Tensor, Tensor>> pairs{{a.out, b.out}, {a.lse, b.lse}, {a.dq, b.dq}, {a.dk, b.dk},
                                                      {a.dv, b.dv}};
  for (const auto& [x, y] : pairs) {
    Tensor cx = contiguous(x), cy = contiguous(y);
    CHECK(std::memcmp(cx.data_ptr(), cy.data_ptr(), cx.nbytes()) == 0);
  }
  // The materialised path stays available on cuda:N and agrees.
  Tensor q = leaf(rand_tensor({2, 2, 150, 64}, 61, DType::f32, -1, 1, kGPU));
  Tensor k = rand_tensor({2, 2, 150, 64}, 62, DType::f32, -1, 1, kGPU);
  Tensor v = rand_tensor({2, 2, 150, 64}, 63, DType::f32, -1, 1, kGPU);
  Tensor dout = rand_tensor({2, 2, 150, 64}, 64, DType::f32, -1, 1, kGPU);
  Generator g1(5), g2(5);
  Tensor flash = scaled_dot_product_attention(q, k, v, true, 0.2, &g1);
  backward(flash, dout);
  Tensor dq_flash = to(q.grad(), kCPU);
  Tensor q2 = leaf(q.detach());
  Tensor math = scaled_dot_product_attention_math(q2, k, v, true, 0.2, &g2);
  backward(math, dout);
  check_near("out", to(flash.detach(), kCPU), to(math.detach(), kCPU), kF32Out);
  check_near("dq", dq_flash, to(q2.grad(), kCPU), kF32Grad);
}

TEST_CASE("cuda flash attention saves O(B NH T) bytes with the cpu's categories and is 10x below the math path",
          "[cuda]") {
  MG_REQUIRE_CUDA();
  // What stays allocated after a recorded forward: the output (also saved) and lse, nothing (T, T).
  const int64_t B = 2, NH = 3, T = 300, HS = 16;
  const std::vector<int64_t> gpu = saved_bytes_by_category(kGPU, {B, NH, T, HS});
  const std::vector<int64_t> cpu = saved_bytes_by_category(Device("cpu:9"), {B, NH, T, HS});
  CHECK(gpu == cpu);
  int64_t total = 0;
  for (int64_t b : gpu) total += b;
  CHECK(total == bytes_of(B * NH * T * HS) + bytes_of(B * NH * T));
  CHECK(total < bytes_of(B * NH * T * T) / 8);
  // Forward + backward's own peak at long T (workspace included) against the math path's.
  for (int64_t TT : {1024, 2048}) {
    INFO("T " << TT);
    const int64_t flash = own_peak(true, 1, 2, TT, 32, kGPU), math = own_peak(false, 1, 2, TT, 32, kGPU);
    CHECK(flash > 0);
    CHECK(math >= 2 * bytes_of(2 * TT * TT));
    CHECK(flash * 10 <= math);
    CHECK(flash < bytes_of(2 * TT * TT) / 8);
  }
}

TEST_CASE("cuda flash attention refuses head sizes above 128 naming the math path", "[cuda]") {
  MG_REQUIRE_CUDA();
  Tensor q = rand_tensor({1, 1, 8, 160}, 70, DType::f32, -1, 1, kGPU);
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, true),
                    Contains("head size 160") && Contains("scaled_dot_product_attention_math"));
  CHECK(scaled_dot_product_attention_math(q, q, q, true).shape() == q.shape());
}
