// Counting the arithmetic of a step for the planner's time estimate (apps/cost_model.h): ops that
// do superlinear work (GEMMs, convolutions, attention) report their floating-point operations
// (2 per multiply-add) by kind, on every device, meta included, to the FlopCounter alive on the
// calling thread. Memory-bound ops report nothing: the cost model charges them by the bytes they
// allocate. Without a counter, counting is a thread-local load and a branch.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace mg {

// gemm_f32: f32 (and f64) GEMM-shaped work, attention included (it computes in f32); gemm_16:
// f16 / bf16 GEMMs (f32 panels, ops/cpu_gemm.h); direct: loops that are not GEMMs (depthwise
// convolution).
enum class FlopKind : uint8_t { gemm_f32, gemm_16, direct };
inline constexpr size_t kNumFlopKinds = 3;
std::string_view flop_kind_name(FlopKind k);  // "gemm_f32", "gemm_16", "direct"

struct FlopCounts {
  std::array<double, kNumFlopKinds> flops{};
  double of(FlopKind k) const { return flops[size_t(k)]; }
  double total() const { return flops[0] + flops[1] + flops[2]; }
};

// While alive, counts this thread's reported FLOPs (nested counters: the innermost counts).
class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;
  const FlopCounts& counts() const { return counts_; }
  friend void count_flops(FlopKind kind, double flops);

 private:
  FlopCounts counts_;
  FlopCounter* prev_;
};

void count_flops(FlopKind kind, double flops);
// The GEMM kind of a product computed in `dtype` (f16 / bf16: gemm_16, else gemm_f32).
FlopKind gemm_kind(DType dtype);

}  // namespace mg
