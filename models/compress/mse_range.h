// The histogram/MSE activation range (the `mse` observer, quant_observer.h): calibration values
// go into a fixed-bin histogram (widened, and the old counts re-binned, when a batch goes past
// its range), and the clipping range is the one whose u8 quantization has the least expected
// squared error over that histogram: a value inside the range costs the rounding error of a
// uniform quantizer, scale^2 / 12; a value outside costs its squared distance to the range's end.
// Min-max keeps every outlier representable and pays for it with a coarse scale for everything
// else; this trades the two (PyTorch's HistogramObserver minimises the same error).
#pragma once
#include <cstdint>
#include <utility>

#include "core/tensor.h"
#include "ops/quantize.h"

namespace mg {

class RangeHistogram {
 public:
  static constexpr int64_t kBins = 2048;
  // x: contiguous f32 values, all finite; [lo, hi] their extremes.
  void add(const float* x, int64_t n, float lo, float hi);
  bool empty() const { return !counts_.defined(); }
  float lo() const { return lo_; }
  float hi() const { return hi_; }
  // Expected squared error of quantizing the histogram's values with q.
  double error(ActivationQParams q) const;
  // The range (containing 0) whose u8 quantization has the least error(); throws when empty.
  std::pair<float, float> mse_range() const;

 private:
  Tensor counts_;  // (kBins) f64, allocator memory (workspace category)
  float lo_ = 0.f, hi_ = 0.f;
};

}  // namespace mg
