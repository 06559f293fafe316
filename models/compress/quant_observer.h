// Observers for post-training quantization: each watches the activations entering a quantized
// layer over the calibration batches and turns what it saw into a u8 (scale, zero point).
// minmax: the extremes over all batches. ema: PyTorch's moving-average min-max (the first batch
// sets the range, later ones move it by `ema_constant`). percentile: the p-th and (100-p)-th
// percentiles of each batch, averaged over batches (clips rare outliers). mse: a histogram of all
// batches and the clipping range with the least expected quantization error (mse_range.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/compress/mse_range.h"
#include "ops/quantize.h"

namespace mg {

enum class ObserverKind { minmax, ema, percentile, mse };

// "minmax", "ema", "percentile", "mse"; throws listing the names.
ObserverKind parse_observer_kind(const std::string& s);
const char* observer_kind_name(ObserverKind k);

struct ObserverOptions {
  ObserverKind kind = ObserverKind::minmax;
  double ema_constant = 0.01;  // PyTorch's MovingAverageMinMaxObserver averaging_constant
  double percentile = 99.99;   // in (50, 100]
};

class Observer {
 public:
  explicit Observer(ObserverOptions opt = {});
  // x: any floating tensor on a cpu device (one batch). Non-finite values are an error.
  void observe(const Tensor& x);
  int64_t batches() const { return batches_; }
  float lo() const { return lo_; }  // mse: the extremes seen; qparams() clips inside them
  float hi() const { return hi_; }
  // Puts a saved state back (QAT keeps it in buffers, so checkpoints and auto-fit retries carry
  // it, models/compress/qat.h). minmax and ema only: percentile keeps per-batch sums.
  void restore(float lo, float hi, int64_t batches);
  // The u8 parameters for the observed range; throws when no batch was observed.
  ActivationQParams qparams() const;

 private:
  ObserverOptions opt_;
  int64_t batches_ = 0;
  float lo_ = 0.f, hi_ = 0.f;
  double lo_sum_ = 0.0, hi_sum_ = 0.0;  // percentile: sums of the per-batch percentiles
  RangeHistogram hist_;                 // mse: every batch's values
};

}  // namespace mg
