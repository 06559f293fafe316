// RangeHistogram's arithmetic. The search tries every pair of bin edges (lo edge <= 0 <= hi edge)
// in O(1) each from prefix sums of n, n*c and n*c^2 over the bin centres c: the clipped mass
// below L costs sum n (c - L)^2 = S2 - 2 L S1 + L^2 S0 over those bins, likewise above H. At
// 2048 bins that is at most ~10^6 candidates, a few milliseconds per layer.
#include "models/compress/mse_range.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/memory_category.h"

namespace mg {
namespace {

int64_t bin_of(double v, double lo, double width, int64_t bins) {
  return std::clamp<int64_t>(int64_t((v - lo) / width), 0, bins - 1);
}

}  // namespace

void RangeHistogram::add(const float* x, int64_t n, float lo, float hi) {
  if (n == 0) return;
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  if (empty()) {
    counts_ = zeros({kBins}, {.dtype = DType::f64});
    lo_ = lo;
    hi_ = hi;
  } else if (lo < lo_ || hi > hi_) {  // widen: every old bin's count moves to the new bin of its centre
    const float nlo = std::min(lo, lo_), nhi = std::max(hi, hi_);
    Tensor wider = zeros({kBins}, {.dtype = DType::f64});
    const double* old = counts_.data<double>();
    double* w = wider.data<double>();
    const double ow = (double(hi_) - lo_) / kBins, nw = (double(nhi) - nlo) / kBins;
    for (int64_t b = 0; b < kBins; ++b)
      if (old[b] > 0) w[ow > 0 ? bin_of(lo_ + (b + 0.5) * ow, nlo, nw, kBins) : bin_of(lo_, nlo, nw, kBins)] += old[b];
    counts_ = wider;
    lo_ = nlo;
    hi_ = nhi;
  }
  double* c = counts_.data<double>();
  const double width = (double(hi_) - lo_) / kBins;
  if (!(width > 0)) {  // every value so far is one number
    c[0] += double(n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) c[bin_of(x[i], lo_, width, kBins)] += 1.0;
}

double RangeHistogram::error(ActivationQParams q) const {
  MG_CHECK(!empty(), "RangeHistogram: no values were added");
  const double* c = counts_.data<double>();
  const double width = (double(hi_) - lo_) / kBins;
  const double L = q.scale * (0 - q.zero_point), H = q.scale * (255 - q.zero_point);
  double err = 0, total = 0;
  for (int64_t b = 0; b < kBins; ++b) {
    const double v = lo_ + (b + 0.5) * width;
    total += c[b];
    if (v < L) err += c[b] * (v - L) * (v - L);
    else if (v > H) err += c[b] * (v - H) * (v - H);
    else err += c[b] * double(q.scale) * q.scale / 12.0;
  }
  return total > 0 ? err / total : 0.0;
}

std::pair<float, float> RangeHistogram::mse_range() const {
  MG_CHECK(!empty(), "RangeHistogram: no values were added, so there is no range to choose");
  const double width = (double(hi_) - lo_) / kBins;
  if (!(width > 0)) return {lo_, hi_};
  const double* c = counts_.data<double>();
  // prefix sums over bins [0, b): count, first and second moments of the bin centres
  std::vector<double> s0(kBins + 1, 0.0), s1(kBins + 1, 0.0), s2(kBins + 1, 0.0);
  for (int64_t b = 0; b < kBins; ++b) {
    const double v = lo_ + (b + 0.5) * width;
    s0[b + 1] = s0[b] + c[b];
    s1[b + 1] = s1[b] + c[b] * v;
    s2[b + 1] = s2[b] + c[b] * v * v;
  }
  // the cost of clamping bins [b0, b1) to the value e
  auto clip_cost = [&](int64_t b0, int64_t b1, double e) {
    return (s2[b1] - s2[b0]) - 2 * e * (s1[b1] - s1[b0]) + e * e * (s0[b1] - s0[b0]);
  };
  // candidate ends: bin edges on each side of 0 (the range always contains 0, choose_qparams_u8)
  const int64_t zero_edge = std::clamp<int64_t>(int64_t(std::ceil(-double(lo_) / width)), 0, kBins);
  double best = INFINITY;
  std::pair<float, float> range{lo_, hi_};
  for (int64_t a = 0; a <= zero_edge; ++a)
    for (int64_t b = std::max<int64_t>(zero_edge, a + 1); b <= kBins; ++b) {
      const float L = float(std::min(0.0, lo_ + a * width)), H = float(std::max(0.0, lo_ + b * width));
      const ActivationQParams q = choose_qparams_u8(L, H);
      const double ql = q.scale * (0 - q.zero_point), qh = q.scale * (255 - q.zero_point);
      // bins whose centre falls outside the representable [ql, qh] are clipped
      const int64_t lo_bins = std::clamp<int64_t>(int64_t(std::ceil((ql - lo_) / width - 0.5)), 0, kBins);
      const int64_t hi_bins = std::clamp<int64_t>(int64_t(std::floor((qh - lo_) / width - 0.5)) + 1, lo_bins, kBins);
      const double err = clip_cost(0, lo_bins, ql) + clip_cost(hi_bins, kBins, qh) +
                         (s0[hi_bins] - s0[lo_bins]) * double(q.scale) * q.scale / 12.0;
      if (err < best) {
        best = err;
        range = {L, H};
      }
    }
  return range;
}

}  // namespace mg
