// How CPU kernels without a native 16-bit path (conv2d, depthwise conv2d) run f16/bf16: they
// stage a group of images in f32 workspace, compute in f32 and round on store. A group is as
// many whole images as fit in kStagingBytes (at least one), so the workspace stays bounded while
// each group is one pass of the f32 kernel over several images (few parallel regions).
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/half_convert.h"
#include "core/parallel.h"

namespace mg {

// 512 KiB of f32 per staged operand: a group's input and output stay in a core's L2 (1 MiB
// here) between the conversion and the kernel. Measured with bench/bench_precision on
// mobilenetv2-32: 4 MiB groups ran the bf16 step at 1.03x of fp32, 512 KiB groups at 0.97x.
inline constexpr int64_t kStagingBytes = int64_t(512) << 10;

// Images per group when one image of the largest staged operand takes `floats_per_image` f32.
inline int64_t staged_images(int64_t floats_per_image, int64_t images) {
  const int64_t fit = kStagingBytes / (4 * std::max<int64_t>(1, floats_per_image));
  return std::clamp<int64_t>(fit, 1, std::max<int64_t>(1, images));
}

// dst[i] = src[i] converted (16-bit <-> f32 through the vectorised convert_span; same-type
// copies for f32 / f64), in parallel chunks.
template <class D, class S>
void convert_n(const S* src, D* dst, int64_t n) {
  parallel_for(0, n, 65536, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<D, S>) std::copy(src + b, src + e, dst + b);
    else convert_span(src + b, dst + b, e - b);
  });
}

}  // namespace mg
