// LLM.int8()-style Int8OutlierLinear (models/compress/int8_outlier_linear.h): equals its reference
// decomposition (f32 outlier columns + dynamically quantized rest), the threshold edge cases
// (0: all f32 = weight-only; inf: no outlier), beats plain int8 on inputs with outlier features,
// a GPT round-trips through the quantized file bit for bit, bad inputs are errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>

#include "autograd/grad_mode.h"
#include "models/compress/int8_outlier_linear.h"
#include "models/compress/quant_convert.h"
#include "models/compress/quant_format.h"
#include "ops/ops.h"
#include "ops/quantize.h"
#include "test_helpers.h"

using namespace mg;
using test::rand_tensor;

namespace {

// x: (R, K) values in [-2, 2]; columns 3 and 11 get a value of +-10 in some rows.
Tensor outlier_input() {
  Tensor x = rand_tensor({6, 16}, 41, DType::f32, -2, 2);
  NoGradGuard ng;
  fill_(x.as_strided({1}, {1}, 1 * 16 + 3), 10.0);
  fill_(x.as_strided({1}, {1}, 4 * 16 + 11), -9.0);
  return x;
}

// The decomposition in f64: int8 part from quantize -> dequantize of x with the outlier columns
// zeroed, f32 part over the outlier columns, both with the dequantized weight, plus the bias.
std::vector<double> reference(const Tensor& x, const Linear& lin, float threshold, int64_t* outliers) {
  const QuantizedChannels q = quantize_per_channel(lin.weight);
  const auto w = dequantize_per_channel(q.values, q.scales).to_double_vector(), b = lin.bias.to_double_vector();
  auto xv = x.to_vector<float>();
  const int64_t R = x.size(0), K = x.size(1), N = lin.out_features;
  std::vector<bool> out_col(size_t(K), false);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) out_col[size_t(k)] = out_col[size_t(k)] || std::fabs(xv[size_t(r * K + k)]) > threshold;
  *outliers = std::count(out_col.begin(), out_col.end(), true);
  std::vector<float> rest = xv;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k)
      if (out_col[size_t(k)]) rest[size_t(r * K + k)] = 0.f;
  float lo = 0, hi = 0;
  for (float v : rest) lo = std::min(lo, v), hi = std::max(hi, v);
  const ActivationQParams aq = choose_qparams_u8(lo, hi);
  const auto rq = dequantize_per_tensor(quantize_per_tensor(from_vector(rest, {R, K}, {.dtype = DType::f32}), aq), aq)
                      .to_double_vector();
  std::vector<double> y(size_t(R * N));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double acc = b[size_t(n)];
      for (int64_t k = 0; k < K; ++k)
        acc += w[size_t(n * K + k)] * (out_col[size_t(k)] ? double(xv[size_t(r * K + k)]) : rq[size_t(r * K + k)]);
      y[size_t(r * N + n)] = acc;
    }
  return y;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, big = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i])), big = std::max(big, std::abs(a[i]));
  return m / big;
}

}  // namespace

TEST_CASE("Int8OutlierLinear equals the reference decomposition, thresholds 0 and inf", "[quant][outlier]") {
  Generator g(3);
  Linear lin(16, 8, true, {.gen = &g});
  const Tensor x = outlier_input();
  NoGradGuard ng;
  const auto f32 = linear(x, lin.weight, lin.bias).to_double_vector();
  double err_at[2] = {0, 0};
  int i = 0;
  for (float thr : {6.0f, std::numeric_limits<float>::infinity(), 0.0f}) {
    INFO("threshold " << thr);
    auto layer = Int8OutlierLinear::from_float(lin, thr);
    const auto y = layer->forward(x).to_double_vector();
    int64_t outliers = 0;
    const auto ref = reference(x, lin, thr, &outliers);
    CHECK(layer->last_outlier_columns == outliers);
    CHECK(max_rel_diff(ref, y) < 1e-5);  // int32-exact int8 part vs f64: f32 rounding only
    if (i < 2) err_at[i] = max_rel_diff(f32, y);
    ++i;
  }
  // threshold 6: the two outlier columns; inf: none (all int8); 0: every column in f32
  CHECK(Int8OutlierLinear::from_float(lin, 6.0f)->forward(x).defined());
  auto t6 = Int8OutlierLinear::from_float(lin, 6.0f);
  t6->forward(x);
  CHECK(t6->last_outlier_columns == 2);
  auto t0 = Int8OutlierLinear::from_float(lin, 0.0f);
  const QuantizedChannels q = quantize_per_channel(lin.weight);
  // threshold 0 is weight-only int8: f32 math on the dequantized weight
  CHECK(max_rel_diff(linear(x, dequantize_per_channel(q.values, q.scales), lin.bias).to_double_vector(),
                     t0->forward(x).to_double_vector()) < 1e-6);
  CHECK(t0->last_outlier_columns == 16);
  // keeping the outlier columns in f32 is closer to f32 than stretching one int8 scale over them
  INFO("error vs f32: threshold 6 " << err_at[0] << ", inf " << err_at[1]);
  CHECK(err_at[0] < 0.5 * err_at[1]);
}

TEST_CASE("Int8OutlierLinear: GPT file round trip, bad inputs", "[quant][outlier]") {
  GPTConfig cfg{.vocab_size = 64, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32};
  GPT gpt(cfg);
  GPT ref(cfg);
  ref.load_state_dict(gpt.state_dict());
  CHECK(quantize_gpt_int8_outlier(gpt, 1.5f) == 4);
  CHECK_THROWS_WITH(quantize_gpt_int8_outlier(gpt), Catch::Contains("already a Int8OutlierLinear"));
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mg_outlier_" + std::to_string(::getpid()) + ".safetensors")).string();
  save_quantized(path, gpt, {.model = "gpt", .config = cfg.to_json(), .scheme = "int8_outlier", .calibration = {}, .layers = {}});
  LoadedQuantizedModel l = load_quantized(path);
  auto* g2 = dynamic_cast<GPT*>(l.model.get());
  REQUIRE(g2 != nullptr);
  NoGradGuard ng;
  Tensor idx = from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4}, {.dtype = DType::i64});
  CHECK(gpt.forward(idx).to_double_vector() == g2->forward(idx).to_double_vector());  // the threshold came back too
  const double rel = max_rel_diff(ref.forward(idx).to_double_vector(), gpt.forward(idx).to_double_vector());
  INFO("relative difference to fp32 " << rel);
  CHECK(rel < 0.05);
  std::filesystem::remove(path);

  Generator g(3);
  Linear lin(16, 8, true, {.gen = &g});
  CHECK_THROWS_WITH(Int8OutlierLinear::from_float(lin, -1.f), Catch::Contains("threshold must be >= 0"));
  CHECK_THROWS_WITH(Int8OutlierLinear::from_float(lin, NAN), Catch::Contains("threshold must be >= 0"));
  auto layer = Int8OutlierLinear::from_float(lin, 6.f);
  CHECK_THROWS_WITH(layer->forward(rand_tensor({2, 15}, 1, DType::f32)), Catch::Contains("expected an f32 input (..., 16)"));
}
