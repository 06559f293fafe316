// Initialisers: values computed in double from the generator's floats, rounded on store; on the
// host, then copied to a GPU tensor (the same values on every device).
#include "models/nn/init.h"

#include <cmath>

#include "core/parallel.h"

namespace mg {
namespace {

// Writes f(position) into every element of t, row-major; positions start at a fresh reservation.
template <typename F>
void fill_from_stream(const Tensor& t, Generator& gen, const char* op, F f) {
  MG_CHECK(is_floating(t.dtype()), op, ": expected a floating tensor, got ", t.dtype());
  if (!t.device().is_cpu() && !t.is_meta()) {
    // A device tensor gets the host's values, drawn from the same stream positions, so a model
    // initialises bit-identically on every device.
    Tensor host = empty(t.shape(), {.dtype = t.dtype(), .device = kCPU});
    fill_from_stream(host, gen, op, f);
    copy_(t, host);
    return;
  }
  uint64_t first = gen.advance(uint64_t(t.numel()));
  t.bump_version();
  if (t.is_meta() || t.numel() == 0) return;
  MG_DISPATCH_FLOAT(t.dtype(), op, [&] {
    scalar_t* base = static_cast<scalar_t*>(t.storage()->data()) + t.storage_offset();
    const Shape& shape = t.shape();
    const Shape& strides = t.strides();
    const int64_t nd = t.dim();
    parallel_for(0, t.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // Offset of logical element i (parameters are contiguous, so this is i in practice).
        int64_t off = 0, rest = i;
        for (int64_t d = nd - 1; d >= 0; --d) {
          off += (rest % shape[d]) * strides[d];
          rest /= shape[d];
        }
        base[off] = convert_scalar<scalar_t, double>(f(first + uint64_t(i)));
      }
    });
  });
}

}  // namespace

void uniform_(const Tensor& t, double lo, double hi, Generator& gen) {
  fill_from_stream(t, gen, "uniform_", [&](uint64_t pos) { return lo + (hi - lo) * double(gen.uniform_at(pos)); });
}

void normal_(const Tensor& t, double mean, double std, Generator& gen) {
  fill_from_stream(t, gen, "normal_", [&](uint64_t pos) { return mean + std * double(gen.normal_at(pos)); });
}

}  // namespace mg
