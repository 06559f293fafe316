// Counting the arithmetic of a step for the planner's time estimate (apps/cost_model.h): ops that
// do superlinear work (GEMMs, convolutions, attention) report their floating-point operations
// (2 per multiply-add) by kind, on every device, meta included, to the FlopCounter alive on the
// calling thread. Memory-bound ops report nothing of their own: every new tensor reports its
// elements, and the cost model charges those. Without a counter, counting is a thread-local load and a branch.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace mg {

// gemm_f32: f32 (and f64) GEMM-shaped work, attention included (it computes in f32); gemm_16:
// f16 / bf16 GEMMs (f32 panels, ops/cpu_gemm.h); direct: loops that are not GEMMs (depthwise
// convolution); conv_f32 / conv_16: the GEMMs of dense convolutions (im2col or pointwise) on f32
// / 16-bit tensors. Convolutions get kinds of their own because their GEMMs are narrow (a few
// dozen to a few hundred input channels, one image or a staged group at a time) and the 16-bit
// ones convert every image to f32 and back: they run at a fraction of a large GEMM's rate.
enum class FlopKind : uint8_t { gemm_f32, gemm_16, direct, conv_f32, conv_16 };
inline constexpr size_t kNumFlopKinds = 5;
std::string_view flop_kind_name(FlopKind k);  // "gemm_f32", "gemm_16", "direct", "conv_f32", "conv_16"

struct FlopCounts {
  std::array<double, kNumFlopKinds> flops{};
  // Elements of the tensors created (every dtype): what the memory-bound ops cost. Elementwise
  // loops, norms and copies convert 16-bit values to f32 and back per element, so their time
  // follows the elements rather than the bytes (a bf16 tensor is not half an f32 one's work).
  double elements = 0;
  double of(FlopKind k) const { return flops[size_t(k)]; }
  double total() const {
    double t = 0;
    for (double f : flops) t += f;
    return t;
  }
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
// A new tensor of n elements (core/tensor.cpp's factories report every one).
void count_elements(int64_t n);
  friend void count_elements(int64_t n);

 private:
  FlopCounts counts_;
  FlopCounter* prev_;
};

void count_flops(FlopKind kind, double flops);
// A new tensor of n elements (core/tensor.cpp's factories report every one).
void count_elements(int64_t n);
// The GEMM kind of a product computed in `dtype` (f16 / bf16: gemm_16, else gemm_f32), and the
// convolution kind of a dense convolution of `dtype` tensors (conv_16, else conv_f32).
FlopKind gemm_kind(DType dtype);
FlopKind conv_kind(DType dtype);

}  // namespace mg
