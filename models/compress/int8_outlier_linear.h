// LLM.int8()-style Linear (Dettmers et al. 2022, "LLM.int8(): 8-bit Matrix Multiplication for
// Transformers at Scale"): large Transformers grow a few input feature columns whose activations
// are far larger than the rest; one per-tensor int8 scale stretched over them would round every
// other feature to almost nothing. So, per forward, the columns whose |x| exceeds a threshold
// (default 6.0) anywhere in the batch are multiplied in f32 (with those weight columns
// dequantized), and the rest goes through the int8 x int8 -> int32 GEMM with a dynamic per-tensor
// u8 quantization of what is left (no calibration):
//   y = int8_gemm(W_q, quant(x with outlier columns zeroed)) * s_w s_x + x[:, O] dequant(W)[:, O]^T + b
// Weights: int8 per output channel (weight_int8, weight_scale), the threshold a buffer
// (outlier_threshold) so the file says how it was made. Threshold 0: every non-zero column in
// f32 (weight-only); infinity: none (all int8).
#pragma once
#include <memory>

#include "models/gpt.h"
#include "models/nn/layers.h"
#include "ops/int8_gemm.h"

namespace mg {

// x: (..., in) f32 -> (..., out).
class Int8OutlierLinear : public Linear {
 public:
  Int8OutlierLinear(int64_t in, int64_t out, bool bias, float threshold, Device device);
  static std::shared_ptr<Int8OutlierLinear> from_float(const Linear& src, float threshold);
  Tensor forward(const Tensor& x) override;
  float threshold() const;
  Tensor weight_int8, weight_scale, outlier_threshold;  // (out, in) i8, (out) f32, (1) f32

  // What the last forward did (tests, reports): outlier columns and rows of x.
  int64_t last_outlier_columns = 0, last_rows = 0;

 private:
  Int8PackedA packed_;
  uint64_t packed_version_ = ~uint64_t(0);
};

// Every block Linear of a GPT becomes an Int8OutlierLinear; returns how many. The embeddings and
// the tied output projection stay f32 (as quantize_gpt_weight_only).
int64_t quantize_gpt_int8_outlier(GPT& model, float threshold = 6.0f);

}  // namespace mg
