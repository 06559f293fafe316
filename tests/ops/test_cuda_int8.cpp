// CPU-vs-CUDA agreement of the int8 inference kernels (ops/cuda/int8_gemm.cu, int8_depthwise.cu,
// quantize.cu): the same inputs on cpu:0 and cuda:0 must give the same bits, because the integer
// sums are exact and the epilogue is the same MG_HOST_DEVICE code (ops/int8_requant.h). The GEMM
// against int8_gemm_ref and the CPU path on odd M, N, K (K not a multiple of 4, several tiles and
// K stages), every epilogue (i32, f32 with scale / bias / clamp, u8), u8 or f32 B, row-major,
// NCHW and transposed layouts; the depthwise conv with stride 1 and 2, padding, odd planes; the
// quantize ops; a linked int8 MobileNetV2 block; and end to end, a quantized tiny MobileNetV2 and
// a weight-only GPT on cuda:0 (moved with .to() and loaded from a file) against cpu:0. Runs when
// MG_TEST_DEVICE=cuda and a GPU is present (scripts/gpu-check); otherwise each case says why not.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "autograd/grad_mode.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "models/compress/quant_modules.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/int8_depthwise.h"
#include "ops/int8_gemm.h"
#include "ops/ops.h"
#include "ops/quantize.h"
#include "cuda_skip.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;
using test::require_same_bits;

namespace {

const Device kGPU(DeviceType::cuda, 0);

// Integers uniform in [lo, hi] as dtype on cpu:0, with the extreme lo first (saturation would show).
Tensor ints(const Shape& s, uint32_t seed, DType dt, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<double> v(size_t(numel_of(s)));
  for (double& x : v) x = dist(rng);
  if (!v.empty()) v[0] = lo;
  return from_vector(v, s, {.dtype = dt});
}

// The epilogue of one GEMM call, with every pointer taken from tensors on one device.
enum class Epilogue { i32, f32, u8 };

struct GemmCase {
  int64_t M, N, K;
  int32_t zero;
  const char* layout;  // "row-major", "nchw" (N = 3 images of N / 3 pixels), "transposed"
};

// (M, N) output layout and B's (K, N) layout for a case.
Int8Layout layout_of(const GemmCase& c, int64_t rows) {
  const std::string l = c.layout;
  if (l == "nchw") return {.group = c.N / 3, .group_stride = rows * (c.N / 3), .col_stride = 1, .row_stride = c.N / 3};
  if (l == "transposed") return {.group = 1, .group_stride = rows, .col_stride = 0, .row_stride = 1};
  return {.group = c.N, .group_stride = 0, .col_stride = 1, .row_stride = c.N};
}

// One GEMM on device d from the same values: B u8, or f32 quantized on the way (f32_b).
Tensor run_gemm(const GemmCase& c, Epilogue e, bool f32_b, Device d) {
  const Tensor a = to(ints({c.M, c.K}, 1, DType::i8, -128, 127), d);
  const Tensor b_u8 = to(ints({c.K * c.N}, 2, DType::u8, 0, 255), d);
  const Tensor b_f32 = to(rand_tensor({c.K * c.N}, 3, DType::f32, -2.0, 3.0), d);
  const Tensor scale = to(rand_tensor({c.M}, 4, DType::f32, 1e-4, 1e-2), d);
  const Tensor bias = to(rand_tensor({c.M}, 5, DType::f32, -1.0, 1.0), d);
  const DType out_dt = e == Epilogue::i32 ? DType::i32 : e == Epilogue::f32 ? DType::f32 : DType::u8;
  Tensor out = zeros({c.M * c.N}, {.dtype = out_dt, .device = d});
  Int8GemmOut o{.layout = layout_of(c, c.M), .row_scale = scale.data<float>(), .bias = bias.data<float>(),
                .clamp_lo = -0.5f, .clamp_hi = 0.75f, .out_inv_scale = 1.f / 0.01f, .out_zero = 37};
  if (e == Epilogue::i32) o.i32 = out.data<int32_t>();
  else if (e == Epilogue::f32) o.f32 = out.data<float>();
  else o.u8 = out.data<uint8_t>();
  const Int8PackedA pa = int8_pack_a(a);
  const Int8Layout bl = layout_of(c, c.K);
  if (f32_b) int8_gemm_quantize_b(pa, c.N, b_f32.data<float>(), bl, 1.f / 0.02f, c.zero, o, d);
  else int8_gemm(pa, c.N, b_u8.data<uint8_t>(), bl, c.zero, o, d);
  return out;
}

const std::vector<GemmCase> kGemmCases = {
    {1, 1, 1, 0, "row-major"},     {5, 7, 3, 3, "row-major"},     {17, 33, 13, 255, "row-major"},
    {70, 129, 37, 128, "row-major"}, {65, 66, 100, 7, "transposed"}, {9, 3 * 25, 31, 19, "nchw"},
    {66, 3 * 49, 70, 200, "nchw"}};

}  // namespace

TEST_CASE("cuda agreement: int8 GEMM i32 equals int8_gemm_ref bit for bit (odd M, N, K)", "[cuda][int8]") {
  MG_REQUIRE_CUDA();
  for (const GemmCase& c : kGemmCases) {
    if (std::string(c.layout) != "row-major") continue;
    INFO("M " << c.M << " N " << c.N << " K " << c.K << " zero " << c.zero);
    const Tensor a = ints({c.M, c.K}, 1, DType::i8, -128, 127), b = ints({c.K * c.N}, 2, DType::u8, 0, 255);
    Tensor ref = empty({c.M * c.N}, {.dtype = DType::i32});
    int8_gemm_ref(c.M, c.N, c.K, a.data<int8_t>(), c.K, b.data<uint8_t>(), c.N, c.zero, ref.data<int32_t>(), c.N);
    require_same_bits("vs int8_gemm_ref", ref, run_gemm(c, Epilogue::i32, false, kGPU));
  }
}

TEST_CASE("cuda agreement: int8 GEMM every epilogue, u8 and f32 B, row-major / NCHW / transposed", "[cuda][int8]") {
  MG_REQUIRE_CUDA();
  for (const GemmCase& c : kGemmCases)
    for (Epilogue e : {Epilogue::i32, Epilogue::f32, Epilogue::u8})
      for (bool f32_b : {false, true}) {
        INFO("M " << c.M << " N " << c.N << " K " << c.K << " " << c.layout << " epilogue " << int(e) << " f32 B "
                  << f32_b);
        require_same_bits("cpu vs cuda", run_gemm(c, e, f32_b, kCPU), run_gemm(c, e, f32_b, kGPU));
      }
}

TEST_CASE("cuda agreement: int8 depthwise conv, stride 1 and 2, padding, every epilogue", "[cuda][int8]") {
  MG_REQUIRE_CUDA();
  for (const Int8DepthwiseShape& s :
       {Int8DepthwiseShape{.N = 2, .C = 5, .H = 7, .W = 9, .K = 3, .stride = 1, .padding = 1},
        Int8DepthwiseShape{.N = 3, .C = 4, .H = 8, .W = 11, .K = 3, .stride = 2, .padding = 1},
        Int8DepthwiseShape{.N = 1, .C = 3, .H = 5, .W = 6, .K = 3, .stride = 1, .padding = 0},
        Int8DepthwiseShape{.N = 2, .C = 2, .H = 13, .W = 10, .K = 5, .stride = 2, .padding = 2}}) {
    INFO("K " << s.K << " stride " << s.stride << " padding " << s.padding << " H " << s.H << " W " << s.W);
    const Tensor x = ints({s.N * s.C * s.H * s.W}, 6, DType::u8, 0, 255);
    const Tensor w = ints({s.C * s.K * s.K}, 7, DType::i8, -128, 127);
    const Tensor scale = rand_tensor({s.C}, 8, DType::f32, 1e-4, 1e-2), bias = rand_tensor({s.C}, 9, DType::f32);
    const int64_t n_out = s.N * s.C * s.OH() * s.OW();
    const int32_t zx = 121;
    Tensor ref = empty({n_out}, {.dtype = DType::i32});
    int8_depthwise_ref(s, x.data<uint8_t>(), zx, w.data<int8_t>(), ref.data<int32_t>());
    for (Epilogue e : {Epilogue::i32, Epilogue::f32, Epilogue::u8}) {
      INFO("epilogue " << int(e));
      const DType dt = e == Epilogue::i32 ? DType::i32 : e == Epilogue::f32 ? DType::f32 : DType::u8;
      Tensor got[2];
      const Device devices[2] = {kCPU, kGPU};
      for (int k = 0; k < 2; ++k) {
        const Device d = devices[k];
        const Tensor xd = to(x, d), wd = to(w, d), sd = to(scale, d), bd = to(bias, d);
        got[k] = zeros({n_out}, {.dtype = dt, .device = d});
        Int8DepthwiseOut o{.scale = sd.data<float>(), .bias = bd.data<float>(),
                           .q = {.lo = 0.f, .hi = 6.f, .out_inv_scale = 1.f / 0.03f, .out_zero = 3}};
        if (e == Epilogue::i32) o.i32 = got[k].data<int32_t>();
        else if (e == Epilogue::f32) o.f32 = got[k].data<float>();
        else o.u8 = got[k].data<uint8_t>();
        int8_depthwise(s, xd.data<uint8_t>(), zx, wd.data<int8_t>(), o, d);
      }
      if (e == Epilogue::i32) require_same_bits("vs int8_depthwise_ref", ref, got[1]);
      require_same_bits("cpu vs cuda", got[0], got[1]);
    }
  }
}

TEST_CASE("cuda agreement: quantize_per_tensor and both dequantizations bit for bit", "[cuda][int8]") {
  MG_REQUIRE_CUDA();
  const ActivationQParams q = choose_qparams_u8(-1.5f, 2.5f);
  const Tensor x = rand_tensor({1000}, 10, DType::f32, -2.0, 3.0);
  require_same_bits("quantize_per_tensor", quantize_per_tensor(x, q), quantize_per_tensor(to(x, kGPU), q));
  const Tensor qx = quantize_per_tensor(x, q);
  require_same_bits("dequantize_per_tensor", dequantize_per_tensor(qx, q), dequantize_per_tensor(to(qx, kGPU), q));
  const QuantizedChannels w = quantize_per_channel(rand_tensor({7, 3, 3, 3}, 11, DType::f32));
  require_same_bits("dequantize_per_channel", dequantize_per_channel(w.values, w.scales),
                    dequantize_per_channel(to(w.values, kGPU), to(w.scales, kGPU)));
}

TEST_CASE("cuda agreement: a linked int8 MobileNetV2 block and Int8Linear give the CPU's bits", "[cuda][int8]") {
  MG_REQUIRE_CUDA();
  NoGradGuard ng;
  Generator g(5);
  const ActivationQParams qx = choose_qparams_u8(-1.f, 3.f), qe = choose_qparams_u8(0.f, 5.f),
                          qd = choose_qparams_u8(0.f, 6.f);
  auto expand = Int8Conv2d::from_float(Conv2d(5, 12, 1, {}, true, {.gen = &g}), qx);
  auto dw = Int8DepthwiseConv2d::from_float(
      Conv2d(12, 12, 3, {.stride = 2, .padding = 1, .groups = 12}, true, {.gen = &g}), qe);
  auto project = Int8Conv2d::from_float(Conv2d(12, 7, 1, {}, true, {.gen = &g}), qd);
  expand->fused_relu6 = dw->fused_relu6 = true;
  Sequential chain;
  chain.push_back(expand);
  chain.push_back(dw);
  chain.push_back(project);
  REQUIRE(link_int8_chains(chain) == 2);
  auto fc = Int8Linear::from_float(Linear(21, 10, true, {.gen = &g}), qx);
  const Tensor x = rand_tensor({3, 5, 9, 11}, 12, DType::f32, -1.0, 3.0);
  const Tensor h = rand_tensor({4, 21}, 13, DType::f32, -1.0, 3.0);
  const Tensor on_cpu = chain.forward(x), fc_cpu = (*fc)(h);
  chain.to(kGPU);
  fc->to(kGPU);
  const Tensor on_gpu = chain.forward(to(x, kGPU)), fc_gpu = (*fc)(to(h, kGPU));
  REQUIRE(on_gpu.device() == kGPU);
  require_same_bits("expand -> depthwise -> project", on_cpu, on_gpu);
  require_same_bits("Int8Linear", fc_cpu, fc_gpu);
}

TEST_CASE("cuda agreement: quantized tiny MobileNetV2 and weight-only GPT logits on cuda:0", "[cuda][int8]") {
  MG_REQUIRE_CUDA();
  NoGradGuard ng;
  Generator g(21);
  auto net = std::make_shared<MobileNetV2>(
      MobileNetV2Config{.width_mult = 0.25, .num_classes = 10, .small_input = true, .dropout = 0.0, .input_size = 32},
      InitOptions{.gen = &g});
  net->eval();
  fold_batch_norms(*net);
  prepare_ptq(*net, {});
  for (uint64_t s : {1, 2}) (*net)(rand_tensor({4, 3, 32, 32}, s, DType::f32));
  convert_ptq(*net);
  const Tensor x = rand_tensor({4, 3, 32, 32}, 1, DType::f32);
  const Tensor ref = (*net)(x);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mg_cuda_int8_" + std::to_string(::getpid()) + ".safetensors")).string();
  save_quantized(path, *net, {.model = "mobilenetv2", .config = net->config().to_json(), .scheme = "int8_ptq",
                              .calibration = {{"observer", "minmax"}, {"batches", 2}}, .layers = {}});
  const LoadedQuantizedModel loaded = load_quantized(path, kGPU);
  std::filesystem::remove(path);
  net->to(kGPU);
  // Every int8 layer is bit-exact (cases above); the f32 parts around them (the stem conv on cuDNN,
  // residual adds, pooling) round differently in the last bits, which can move an activation
  // sitting on a u8 rounding boundary by one step. So the logits agree closely, not bitwise.
  for (const Tensor& got : {(*net)(to(x, kGPU)), dynamic_cast<MobileNetV2&>(*loaded.model)(to(x, kGPU))}) {
    REQUIRE(got.device() == kGPU);
    const std::vector<double> a = ref.to_double_vector(), b = got.to_double_vector();
    double amax = 0, diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      amax = std::max(amax, std::abs(a[i]));
      diff = std::max(diff, std::abs(a[i] - b[i]));
    }
    INFO("max |cpu - cuda| " << diff << " of max |logit| " << amax);
    CHECK(diff <= 1e-2 * amax);
  }
  const GPTConfig cfg{.vocab_size = 64, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 64};
  GPT gpt(cfg);
  quantize_gpt_weight_only(gpt);
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 33, 2, 60, 7, 7}, {1, 8}, {.dtype = DType::i64});
  const Tensor logits_cpu = gpt.forward(idx);
  gpt.to(kGPU);
  const std::vector<double> a = logits_cpu.to_double_vector(), b = gpt.forward(to(idx, kGPU)).to_double_vector();
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - b[i]) <= 1e-4 * (1.0 + std::abs(a[i])));
}
