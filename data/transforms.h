// Image transforms that compose into a pipeline (compose({resize(32), random_crop(32, 4),
// random_horizontal_flip(), to_tensor(), normalize(mean, std)})) and a dataset wrapper that
// applies one to every example's input. Layout rule: a u8 image is (H, W, C), a floating one
// (after to_tensor) is (C, H, W). Random transforms draw from a Generator keyed by
// (seed, epoch, index), so the augmentation of an example is reproducible and a resumed run
// sees the same pixels. resize is the "smaller inputs" technique: memory scales with H * W.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "data/dataset.h"

namespace mg {

// A transform takes an image and the example's generator; a random transform reserves the
// stream positions it reads with rng.advance(n), so transforms later in a chain draw fresh ones.
using Transform = std::function<Tensor(const Tensor& image, Generator& rng)>;

// The generator an example's transforms draw from.
Generator transform_generator(uint64_t seed, int64_t epoch, int64_t index);

// Applies the transforms in order.
Transform compose(std::vector<Transform> transforms);
// (H, W, C) u8 -> (C, H, W) f32 in [0, 1].
Transform to_tensor();
// (C, H, W) f32 -> (x - mean[c]) / std[c]; mean and std have C entries (or one for all).
Transform normalize(std::vector<float> mean, std::vector<float> std);
// (H, W, C) u8 -> (height, width, C) u8 (stb_image_resize); resize(S) gives S x S.
Transform resize(int64_t height, int64_t width);
Transform resize(int64_t size);
// Zero-pads `padding` pixels on each side, then cuts a random size x size square.
// (H, W, C) u8 or (C, H, W) float.
Transform random_crop(int64_t size, int64_t padding = 0);
// Mirrors left-right with probability p. (H, W, C) u8 or (C, H, W) float.
Transform random_horizontal_flip(double p = 0.5);
// One channel repeated three times: (H, W, 1) u8 -> (H, W, 3), (1, H, W) float -> (3, H, W);
// a 3-channel image passes unchanged.
Transform gray_to_rgb();

// A dataset whose inputs pass through `transform` (targets unchanged).
class TransformedDataset : public Dataset {
 public:
  TransformedDataset(std::shared_ptr<const Dataset> base, Transform transform, uint64_t seed = 0);
  int64_t size() const override { return base_->size(); }
  Example get(int64_t index, int64_t epoch = 0) const override;

 private:
  std::shared_ptr<const Dataset> base_;
  Transform transform_;
  uint64_t seed_;
};

}  // namespace mg
