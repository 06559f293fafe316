// Counting the work of a step for the planner's time estimate (apps/cost_model.h): ops that do
// superlinear work (GEMMs, convolutions, attention) report their floating-point operations (2 per
// multiply-add) by kind, on every device, meta included, to the FlopCounter alive on the calling
// thread. Memory-bound ops report nothing of their own: every new tensor reports its elements, and
// the counter files them by their reuse distance (Note [Reuse distance]), which decides whether
// the cost model charges them at a cache's bandwidth or at main memory's. Without a counter,
// counting is a thread-local load and a branch.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"

namespace mg {

// gemm_f32: f32 (and f64) GEMM-shaped work, attention included (it computes in f32); gemm_16:
// f16 / bf16 GEMMs (f32 panels, ops/cpu_gemm.h); direct: loops that are not GEMMs (depthwise
// convolution); conv_f32 / conv_16: the GEMMs of dense convolutions (im2col or pointwise) on f32
// / 16-bit tensors. Convolutions get kinds of their own because their GEMMs are narrow (a few
// dozen to a few hundred input channels, one image or a staged group at a time) and the 16-bit
// ones convert every image to f32 and back: they run at a fraction of a large GEMM's rate.
// batch_norm: not FLOPs but the elements a training batch norm's forward or its backward
// normalises (x's elements, once per call): both run several passes over them (statistics, then
// the output; the gradient's two sums, then dx; the clamp's mask recomputed), which the one write
// and one read charged for each created tensor (FlopCounts::elements) leave out.
enum class FlopKind : uint8_t { gemm_f32, gemm_16, direct, conv_f32, conv_16, batch_norm };
inline constexpr size_t kNumFlopKinds = 6;
std::string_view flop_kind_name(FlopKind k);  // "gemm_f32", ..., "conv_16", "batch_norm"

// Note [Reuse distance]
// A tensor is touched twice as far as the counter can tell: written when it is created, and read
// for the last time just before it is released (an op's temporaries when the op returns, a saved
// activation right after its backward node ran). Its reuse distance is its own bytes plus the
// bytes of every other tensor touched in between, each counted once: the least-recently-used
// stack distance of that last read, the data a cache must hold for it to hit. A temporary read by
// the next op has a distance of a few tensors; an activation saved in the forward pass and read
// in the backward pass has about everything the step creates and reads in between, which grows
// with the micro-batch. A released tensor's bytes count as touched until they age out like any
// other. A tensor still alive when the counts are read is counted up to that moment.
// Distances are filed in powers of two: bucket k holds distances in [2^k, 2^(k+1)) bytes.
inline constexpr size_t kNumReuseBuckets = 48;
size_t reuse_bucket(double distance_bytes);        // floor(log2), clamped to the buckets
double reuse_bucket_bytes(size_t bucket);          // the bucket's geometric middle, 2^(k + 1/2)

struct FlopCounts {
  std::array<double, kNumFlopKinds> flops{};
  // Elements of the tensors created (every dtype): what the memory-bound ops cost. Elementwise
  // loops, norms and copies convert 16-bit values to f32 and back per element, so their time
  // follows the elements rather than the bytes (a bf16 tensor is not half an f32 one's work).
  double elements = 0;
  // The same elements by their tensor's reuse distance (they sum to `elements`).
  std::array<double, kNumReuseBuckets> elements_by_reuse{};
  double of(FlopKind k) const { return flops[size_t(k)]; }
  // The floating-point operations of every kind (batch_norm counts elements, not FLOPs: left out).
  double total() const {
    double t = 0;
    for (size_t k = 0; k < kNumFlopKinds; ++k)
      if (FlopKind(k) != FlopKind::batch_norm) t += flops[k];
    return t;
  }
};

// While alive, counts this thread's reported FLOPs and new tensors (nested counters: the
// innermost counts). It watches the allocator for the release of the tensors it counted, on any
// thread, to know their reuse distances.
class FlopCounter final : private AllocatorObserver {
 public:
  FlopCounter();
  ~FlopCounter() override;
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;
  // The counts so far; the tensors still alive are filed at their distance up to now.
  FlopCounts counts() const;
  friend void count_flops(FlopKind kind, double flops);
  friend void count_elements(int64_t n, size_t bytes, Device device, uint64_t block_id);

 private:
  void on_event(const MemoryEvent& e) override;

  using BlockKey = std::tuple<DeviceType, int, uint64_t>;  // an allocator's block: (device, id)
  struct LiveTensor {
    size_t touched_at;  // the touch (an index into touched_bytes_) that wrote it
    double bytes;
    double elements;
  };
  // The touches in order: touched_bytes_[i] holds the bytes whose latest touch is the i-th (a
  // later touch of the same tensor moves them), summed by a Fenwick tree for the bytes touched since.
  size_t touch(double bytes);
  void add_touched(size_t i, double bytes);  // bytes may be negative (moved to a later touch)
  double touched_after(size_t i) const;
  double distance(const LiveTensor& t) const { return t.bytes + touched_after(t.touched_at); }

  mutable std::mutex mu_;  // the release of a counted tensor may come from another thread
  FlopCounts counts_;
  std::vector<double> touched_bytes_;
  std::vector<double> fenwick_;  // capacity a power of two, at least touched_bytes_'s size
  std::map<BlockKey, LiveTensor> live_;
  FlopCounter* prev_;
};

void count_flops(FlopKind kind, double flops);
// A new tensor of n elements and `bytes` bytes in the allocator's block `block_id` of `device`
// (0: no block, an empty tensor). core/tensor.cpp's factory reports every one.
void count_elements(int64_t n, size_t bytes, Device device, uint64_t block_id);
// The GEMM kind of a product computed in `dtype` (f16 / bf16: gemm_16, else gemm_f32), and the
// convolution kind of a dense convolution of `dtype` tensors (conv_16, else conv_f32).
FlopKind gemm_kind(DType dtype);
FlopKind conv_kind(DType dtype);

}  // namespace mg
