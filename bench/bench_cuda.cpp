// GPU benchmarks (built with the CUDA backend only; run by scripts/gpu-check on a GPU machine):
// memgrad's op next to the library call it should match, timed with CUDA events on memgrad's
// stream, the median of 10 timed runs after 3 warm-ups (docs/DESIGN's rule for time figures):
//   matmul 4096^3 in f32, TF32 and bf16 (TFLOP/s) vs cublasGemmEx called directly;
//   copy_, cast and add (GB/s counting bytes read + written) vs cudaMemcpy device to device;
//   softmax and layer_norm bandwidth as a fraction of the cudaMemcpy bandwidth;
//   one MobileNetV2 inverted-residual block (batch 32, 112x112, 16 -> 96 -> 24, stride 2)
//   forward + backward on cuDNN (ms per step, images/s);
//   gpt2-124m's attention forward + backward, flash kernels vs the math path (ms, own peak MiB);
//   the int8 GEMM 4096^3 (ops/cuda/int8_gemm.cu, u8 x s8 -> f32 epilogue; TOPS) vs f32 matmul.
// Prints one table, then "RESULT <name> <value> <unit> <ratio>" lines for scripts to collect.
// A standalone program (no Google Benchmark), so a machine with only the CUDA toolkit runs it.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/cuda/backend.h"
#include "core/cuda/context.h"
#include "core/rng.h"
#include "ops/int8_gemm.h"
#include "ops/ops.h"

using namespace mg;

namespace {

const Device kGPU(DeviceType::cuda, 0);

struct Row {
  std::string name;
  double value;
  std::string unit;
  std::string reference;  // what the ratio compares with
  double ratio;           // value / reference value (0: none)
};
std::vector<Row> g_rows;

// Median milliseconds of f() over `iters` runs on memgrad's stream of cuda:0.
double time_ms(const std::function<void()>& f, int warmup = 3, int iters = 10) {
  cudaStream_t s = cuda::stream(0);
  cudaEvent_t a, b;
  MG_CUDA_CHECK(cudaEventCreate(&a));
  MG_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  MG_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    MG_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    MG_CUDA_CHECK(cudaEventRecord(b, s));
    MG_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MG_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  MG_CUDA_CHECK(cudaEventDestroy(a));
  MG_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

// Uniform [-1, 1) on the GPU: a host tile of 1M values repeated (fast to make, never all zeros).
Tensor gpu_uniform(const Shape& s, uint64_t seed, DType dt = DType::f32) {
  const int64_t n = numel_of(s), tile = std::min<int64_t>(n, 1 << 20);
  Generator g(seed);
  std::vector<double> v(static_cast<size_t>(tile));
  for (int64_t i = 0; i < tile; ++i) v[size_t(i)] = 2.0 * g.uniform_at(uint64_t(i)) - 1.0;
  Tensor t = from_vector(v, {tile}, {.dtype = dt, .device = kGPU});
  Tensor out = empty({n}, {.dtype = dt, .device = kGPU});
  for (int64_t o = 0; o < n; o += tile) copy_(narrow(out, 0, o, std::min(tile, n - o)), narrow(t, 0, 0, std::min(tile, n - o)));
  return reshape(out, s);
}

void add_row(const std::string& name, double value, const std::string& unit, const std::string& ref, double ref_value) {
  g_rows.push_back({name, value, unit, ref, ref_value > 0 ? value / ref_value : 0});
}

// ---- matmul ----------------------------------------------------------------------------------

void bench_matmul() {
  const int64_t n = 4096;
  const double flop = 2.0 * double(n) * double(n) * double(n);
  cublasHandle_t h;
  MG_CUBLAS_CHECK(cublasCreate(&h));
  MG_CUBLAS_CHECK(cublasSetStream(h, cuda::stream(0)));
  struct Mode {
    const char* name;
    DType dt;
    bool tf32;
  };
  for (Mode m : {Mode{"f32", DType::f32, false}, Mode{"tf32", DType::f32, true}, Mode{"bf16", DType::bf16, false}}) {
    cuda::set_allow_tf32(m.tf32);
    Tensor a = gpu_uniform({n, n}, 1, m.dt), b = gpu_uniform({n, n}, 2, m.dt);
    Tensor c = empty({n, n}, {.dtype = m.dt, .device = kGPU});
    NoGradGuard no_grad;
    const double ms_mg = time_ms([&] { Tensor out = matmul(a, b); });
    const cudaDataType_t t = m.dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t ct = m.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float one = 1, zero = 0;
    const int ni = int(n);
    const double ms_cublas = time_ms([&] {
      MG_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one, b.data_ptr(), t, ni, a.data_ptr(), t,
                                   ni, &zero, c.data_ptr(), t, ni, ct, CUBLAS_GEMM_DEFAULT));
    });
    const double tf_mg = flop / ms_mg * 1e-9, tf_cublas = flop / ms_cublas * 1e-9;
    add_row(std::string("matmul ") + m.name + " 4096^3", tf_mg, "TFLOP/s",
            "cuBLAS " + std::to_string(int(tf_cublas)) + " TFLOP/s", tf_cublas);
  }
  cuda::set_allow_tf32(false);
  MG_CUBLAS_CHECK(cublasDestroy(h));
}

// ---- memory-bound ops ------------------------------------------------------------------------

double bench_bandwidth() {
  const int64_t n = int64_t(256) << 20;  // 256M floats = 1 GiB
  Tensor a = gpu_uniform({n}, 3), b = gpu_uniform({n}, 4), c = empty({n}, {.device = kGPU});
  NoGradGuard no_grad;
  const double bytes = double(n) * 4;
  const double ms_memcpy = time_ms([&] {
    MG_CUDA_CHECK(cudaMemcpyAsync(c.data_ptr(), a.data_ptr(), size_t(bytes), cudaMemcpyDeviceToDevice, cuda::stream(0)));
  });
  const double gbs_memcpy = 2 * bytes / ms_memcpy * 1e-6;
  add_row("cudaMemcpy D2D 1 GiB", gbs_memcpy, "GB/s", "-", 0);
  const double ms_copy = time_ms([&] { copy_(c, a); });
  add_row("copy_ f32 1 GiB", 2 * bytes / ms_copy * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  const double ms_strided = time_ms([&] { copy_(reshape(c, {16384, 16384}), transpose(reshape(a, {16384, 16384}), 0, 1)); });
  add_row("copy_ transposed 16384^2 f32", 2 * bytes / ms_strided * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  const double ms_cast = time_ms([&] { Tensor h = cast(a, DType::bf16); });
  add_row("cast f32 -> bf16", 1.5 * bytes / ms_cast * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  const double ms_add = time_ms([&] { Tensor s = add(a, b); });
  add_row("add f32 (2 reads, 1 write)", 3 * bytes / ms_add * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  Tensor x = reshape(a, {32768, 8192});
  const double ms_softmax = time_ms([&] { Tensor y = softmax(x, -1); });
  add_row("softmax (32768, 8192) f32", 2 * bytes / ms_softmax * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  Tensor xl = reshape(a, {262144, 1024}), w = gpu_uniform({1024}, 5), bias = gpu_uniform({1024}, 6);
  const double ms_ln = time_ms([&] { Tensor y = layer_norm(xl, w, bias); });
  add_row("layer_norm (262144, 1024) f32", 2 * bytes / ms_ln * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  Tensor logits = reshape(narrow(a, 0, 0, int64_t(8192) * 32768), {8192, 32768});
  Tensor target = cast(mul(add(narrow(b, 0, 0, 8192), 1.0), 16000.0), DType::i64);
  const double ms_ce = time_ms([&] { Tensor l = cross_entropy(logits, target); });
  add_row("cross_entropy (8192, 32768) f32", double(logits.nbytes()) / ms_ce * 1e-6, "GB/s", "cudaMemcpy", gbs_memcpy);
  return gbs_memcpy;
}

// ---- a MobileNetV2 block on cuDNN -------------------------------------------------------------

void bench_mobilenet_block() {
  const int64_t N = 32, Cin = 16, E = 96, Cout = 24, H = 112;
  Tensor x = gpu_uniform({N, Cin, H, H}, 7);
  auto param = [](Shape s, uint64_t seed) { return gpu_uniform(s, seed).set_requires_grad(true); };
  Tensor w1 = param({E, Cin, 1, 1}, 8), wd = param({E, 1, 3, 3}, 9), w2 = param({Cout, E, 1, 1}, 10);
  Tensor g1 = param({E}, 11), b1 = param({E}, 12), g2 = param({E}, 13), b2 = param({E}, 14);
  Tensor g3 = param({Cout}, 15), b3 = param({Cout}, 16);
  Tensor rm1 = zeros({E}, {.device = kGPU}), rv1 = ones({E}, {.device = kGPU});
  Tensor rm2 = zeros({E}, {.device = kGPU}), rv2 = ones({E}, {.device = kGPU});
  Tensor rm3 = zeros({Cout}, {.device = kGPU}), rv3 = ones({Cout}, {.device = kGPU});
  auto step = [&] {
    Tensor h = relu6(batch_norm(conv2d(x, w1), rm1, rv1, g1, b1, true));                                   // expand 1x1
    h = relu6(batch_norm(conv2d(h, wd, Tensor(), {.stride = 2, .padding = 1, .groups = E}), rm2, rv2, g2, b2, true));  // dw 3x3
    h = batch_norm(conv2d(h, w2), rm3, rv3, g3, b3, true);                                                 // project 1x1
    backward(sum(h));
    for (Tensor* p : {&w1, &wd, &w2, &g1, &b1, &g2, &b2, &g3, &b3}) p->set_grad(Tensor());
  };
  const double ms = time_ms(step);
  add_row("MobileNetV2 block fwd+bwd (32, 16, 112, 112)", ms, "ms", "images/s " + std::to_string(int(N / ms * 1e3)), 0);
}

// ---- attention: the flash kernels against the math path ------------------------------------------

// gpt2-124m's attention (B 8, NH 12, T 1024, HS 64, causal, f32) forward + backward: ms per step
// and the peak bytes a step adds beyond q, k, v, dout (for the flash path: the output, lse and D;
// for the math path also the (B, NH, T, T) weights and their scratch).
void bench_attention() {
  const int64_t B = 8, NH = 12, T = 1024, HS = 64;
  Tensor q = gpu_uniform({B, NH, T, HS}, 19).set_requires_grad(true);
  Tensor k = gpu_uniform({B, NH, T, HS}, 20).set_requires_grad(true);
  Tensor v = gpu_uniform({B, NH, T, HS}, 21).set_requires_grad(true);
  Tensor dout = gpu_uniform({B, NH, T, HS}, 22);
  double ms[2], mib[2];
  for (int flash = 0; flash < 2; ++flash) {
    auto step = [&] {
      Tensor out = flash ? scaled_dot_product_attention(q, k, v, true) : scaled_dot_product_attention_math(q, k, v, true);
      backward(out, dout);
      for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
    };
    step();
    MG_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(0)));
    const int64_t base = memory_stats(kGPU).allocated.current;
    reset_peak_stats(kGPU);
    step();
    mib[flash] = double(memory_stats(kGPU).allocated.peak - base) / (1 << 20);
    ms[flash] = time_ms(step);
  }
  add_row("attention fwd+bwd flash (8, 12, 1024, 64)", ms[1], "ms", "math path", ms[0]);
  add_row("attention flash own peak", mib[1], "MiB", "math path", mib[0]);
}

// ---- int8 GEMM ------------------------------------------------------------------------------

void bench_int8_gemm() {
  const int64_t n = 4096;
  const double ops = 2.0 * double(n) * double(n) * double(n);
  NoGradGuard no_grad;
  const Tensor a = cast(mul(gpu_uniform({n, n}, 17), 127.0), DType::i8);         // weights (M, K) s8
  const Tensor b = cast(mul(add(gpu_uniform({n, n}, 18), 1.0), 127.0), DType::u8);  // activations (K, N) u8
  const Tensor scale = full({n}, 1e-3, {.device = kGPU});
  Tensor out = empty({n, n}, {.device = kGPU});
  const Int8PackedA pa = int8_pack_a(a);
  const Int8Layout rm{.group = n, .group_stride = 0, .col_stride = 1, .row_stride = n};
  const double ms_int8 = time_ms([&] {
    int8_gemm(pa, n, b.data<uint8_t>(), rm, 128,
              {.f32 = out.data<float>(), .layout = rm, .row_scale = scale.data<float>()}, kGPU);
  });
  const Tensor fa = gpu_uniform({n, n}, 1), fb = gpu_uniform({n, n}, 2);
  const double ms_f32 = time_ms([&] { Tensor o = matmul(fa, fb); });
  const double tops = ops / ms_int8 * 1e-9, tf_f32 = ops / ms_f32 * 1e-9;
  add_row("int8 GEMM 4096^3 (dp4a) -> f32", tops, "TOPS", "matmul f32 " + std::to_string(int(tf_f32)) + " TFLOP/s",
          tf_f32);
}

}  // namespace

int main() {
  try {
    if (cuda::device_count() == 0) {
      std::printf("bench_cuda: no CUDA device (%s)\n", cuda::device_count_error().c_str());
      return 2;
    }
    std::printf("bench_cuda on %s\n", cuda::device_description(0).c_str());
    bench_matmul();
    bench_bandwidth();
    bench_mobilenet_block();
    bench_attention();
    bench_int8_gemm();
    std::printf("\n%-46s %12s %-8s %-28s %6s\n", "benchmark", "memgrad", "unit", "reference", "ratio");
    for (const Row& r : g_rows)
      std::printf("%-46s %12.2f %-8s %-28s %6.2f\n", r.name.c_str(), r.value, r.unit.c_str(), r.reference.c_str(), r.ratio);
    std::printf("\npeak allocated on cuda:0: %s\n", format_bytes(memory_stats(kGPU).allocated.peak).c_str());
    for (const Row& r : g_rows) {
      std::string key = r.name;
      std::replace(key.begin(), key.end(), ' ', '_');
      std::printf("RESULT %s %.4f %s %.4f\n", key.c_str(), r.value, r.unit.c_str(), r.ratio);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
