// Observer arithmetic. The percentile observer copies a batch into workspace (allocator memory)
// and selects the two order statistics with nth_element.
#include "models/compress/quant_observer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory_category.h"
#include "ops/ops.h"

namespace mg {

ObserverKind parse_observer_kind(const std::string& s) {
  if (s == "minmax") return ObserverKind::minmax;
  if (s == "ema") return ObserverKind::ema;
  if (s == "percentile") return ObserverKind::percentile;
  if (s == "mse") return ObserverKind::mse;
  MG_THROW("unknown observer '", s, "' (known: minmax, ema, percentile, mse)");
}

const char* observer_kind_name(ObserverKind k) {
  switch (k) {
    case ObserverKind::minmax: return "minmax";
    case ObserverKind::ema: return "ema";
    case ObserverKind::percentile: return "percentile";
    case ObserverKind::mse: return "mse";
  }
  return "?";
}

Observer::Observer(ObserverOptions opt) : opt_(opt) {
  MG_CHECK(opt_.ema_constant > 0 && opt_.ema_constant <= 1, "Observer: ema_constant must be in (0, 1], got ",
           opt_.ema_constant);
  MG_CHECK(opt_.percentile > 50 && opt_.percentile <= 100, "Observer: percentile must be in (50, 100], got ",
           opt_.percentile);
}

void Observer::observe(const Tensor& x) {
  MG_CHECK(x.defined() && is_floating(x.dtype()) && !x.is_meta(), "Observer: expected a floating cpu tensor");
  const int64_t n = x.numel();
  if (n == 0) return;
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  Tensor xf = contiguous(cast(x, DType::f32));
  const float* p = xf.data<float>();
  float lo = p[0], hi = p[0];
  for (int64_t i = 0; i < n; ++i) {
    MG_CHECK(std::isfinite(p[i]), "Observer: the activations hold a non-finite value (", p[i], ") at element ", i);
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  if (opt_.kind == ObserverKind::percentile) {
    Tensor copy = clone(xf);
    float* c = copy.data<float>();
    const double q = opt_.percentile / 100.0;
    const int64_t ih = std::min<int64_t>(n - 1, int64_t(std::ceil(q * double(n - 1))));
    const int64_t il = std::max<int64_t>(0, int64_t(std::floor((1.0 - q) * double(n - 1))));
    std::nth_element(c, c + ih, c + n);
    hi = c[ih];
    std::nth_element(c, c + il, c + n);
    lo = c[il];
    lo_sum_ += lo;
    hi_sum_ += hi;
    ++batches_;
    lo_ = float(lo_sum_ / double(batches_));
    hi_ = float(hi_sum_ / double(batches_));
    return;
  }
  if (opt_.kind == ObserverKind::mse) hist_.add(p, n, lo, hi);
  if (batches_ == 0 || opt_.kind == ObserverKind::minmax || opt_.kind == ObserverKind::mse) {
    lo_ = batches_ == 0 ? lo : std::min(lo_, lo);
    hi_ = batches_ == 0 ? hi : std::max(hi_, hi);
  } else {  // ema
    const float c = float(opt_.ema_constant);
    lo_ = lo_ + c * (lo - lo_);
    hi_ = hi_ + c * (hi - hi_);
  }
  ++batches_;
}

void Observer::restore(float lo, float hi, int64_t batches) {
  MG_CHECK(opt_.kind == ObserverKind::minmax || opt_.kind == ObserverKind::ema, "Observer::restore: a ",
           observer_kind_name(opt_.kind), " observer cannot be restored (minmax and ema only)");
  MG_CHECK(batches >= 0 && (batches == 0 || (std::isfinite(lo) && std::isfinite(hi) && lo <= hi)),
           "Observer::restore: invalid state [", lo, ", ", hi, "] after ", batches, " batches");
  lo_ = lo;
  hi_ = hi;
  batches_ = batches;
}

ActivationQParams Observer::qparams() const {
  MG_CHECK(batches_ > 0, "Observer: no calibration batch was observed, so there is no activation range\n"
                         "  hint: calibrate with at least one batch (--calibrate N, N >= 1)");
  if (opt_.kind == ObserverKind::mse) {
    const auto [lo, hi] = hist_.mse_range();
    return choose_qparams_u8(lo, hi);
  }
  return choose_qparams_u8(lo_, hi_);
}

}  // namespace mg
