// Image transforms (see transforms.h). Crop and flip share one copy loop over the image seen
// as (outer, H, W, inner): a u8 (H, W, C) image is (1, H, W, C), a float (C, H, W) one is
// (C, H, W, 1), so both layouts move whole pixels with memcpy and pad with zeros.
#include "data/transforms.h"

#include <cstring>

#include "core/error.h"
#include "data/image.h"
#include "ops/ops.h"

namespace mg {

namespace {

struct Layout {
  int64_t outer, H, W, inner;
  bool hwc;  // u8 (H, W, C); otherwise floating (C, H, W)
};

Layout layout_of(const char* op, const Tensor& x) {
  MG_CHECK(x.dim() == 3, op, ": expects an (H, W, C) u8 or (C, H, W) float image, got shape ", x.shape());
  MG_CHECK(x.device().is_cpu(), op, ": expects an image on a cpu device, got ", x.device().str());
  if (x.dtype() == DType::u8) return {1, x.size(0), x.size(1), x.size(2), true};
  MG_CHECK(is_floating(x.dtype()), op, ": expects a u8 (H, W, C) or floating (C, H, W) image, got ", x.dtype());
  return {x.size(0), x.size(1), x.size(2), 1, false};
}

Shape shape_of(const Layout& l, int64_t H, int64_t W) {
  return l.hwc ? Shape{H, W, l.inner} : Shape{l.outer, H, W};
}

// out[o, y, x] = in[o, y + top, flip ? W - 1 - (x + left) : x + left], zero outside the image.
Tensor crop_flip(const Tensor& image, const Layout& l, int64_t top, int64_t left, int64_t out_h, int64_t out_w,
                 bool flip) {
  Tensor x = contiguous(image);
  Tensor out = zeros(shape_of(l, out_h, out_w), {.dtype = x.dtype(), .device = x.device()});
  const size_t pixel = size_t(l.inner) * x.element_size();
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t y = 0; y < out_h; ++y) {
      int64_t sy = y + top;
      if (sy < 0 || sy >= l.H) continue;
      for (int64_t c = 0; c < out_w; ++c) {
        int64_t sx = flip ? l.W - 1 - (c + left) : c + left;
        if (sx < 0 || sx >= l.W) continue;
        std::memcpy(dst + size_t((o * out_h + y) * out_w + c) * pixel, src + size_t((o * l.H + sy) * l.W + sx) * pixel,
                    pixel);
      }
    }
  return out;
}

}  // namespace

Generator transform_generator(uint64_t seed, int64_t epoch, int64_t index) {
  return Generator(derive_seed(seed, {uint64_t(epoch), uint64_t(index)}));
}

Transform compose(std::vector<Transform> transforms) {
  for (size_t i = 0; i < transforms.size(); ++i)
    MG_CHECK(transforms[i] != nullptr, "compose: transform ", i, " is empty");
  return [ts = std::move(transforms)](const Tensor& image, Generator& rng) {
    Tensor x = image;
    for (const Transform& t : ts) x = t(x, rng);
    return x;
  };
}

Transform to_tensor() {
  return [](const Tensor& image, Generator&) {
    MG_CHECK(image.dtype() == DType::u8 && image.dim() == 3, "to_tensor: expects an (H, W, C) u8 image, got shape ",
             image.shape(), " ", image.dtype());
    Tensor x = contiguous(image);
    const int64_t H = x.size(0), W = x.size(1), C = x.size(2);
    Tensor out = empty({C, H, W}, {.dtype = DType::f32, .device = x.device()});  // (C, H, W)
    const uint8_t* s = x.data<uint8_t>();
    float* d = out.data<float>();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H * W; ++i) d[c * H * W + i] = float(s[i * C + c]) * (1.0f / 255.0f);
    return out;
  };
}

Transform normalize(std::vector<float> mean, std::vector<float> std) {
  MG_CHECK(!mean.empty() && mean.size() == std.size(), "normalize: mean and std need the same number of entries, got ",
           mean.size(), " and ", std.size());
  for (float s : std) MG_CHECK(s > 0.0f, "normalize: std must be positive, got ", s);
  return [mean = std::move(mean), std = std::move(std)](const Tensor& image, Generator&) {
    MG_CHECK(image.dtype() == DType::f32 && image.dim() == 3,
             "normalize: expects a (C, H, W) f32 image (apply to_tensor first), got shape ", image.shape(), " ",
             image.dtype());
    const int64_t C = image.size(0), HW = image.size(1) * image.size(2);
    MG_CHECK(mean.size() == 1 || int64_t(mean.size()) == C, "normalize: ", mean.size(),
             " means and stds for an image with ", C, " channels ", image.shape());
    Tensor x = contiguous(image);
    Tensor out = empty(x.shape(), {.dtype = DType::f32, .device = x.device()});
    const float* s = x.data<float>();
    float* d = out.data<float>();
    for (int64_t c = 0; c < C; ++c) {
      const size_t k = mean.size() == 1 ? 0 : size_t(c);
      const float m = mean[k], inv = 1.0f / std[k];
      for (int64_t i = 0; i < HW; ++i) d[c * HW + i] = (s[c * HW + i] - m) * inv;
    }
    return out;
  };
}

Transform resize(int64_t height, int64_t width) {
  MG_CHECK(height > 0 && width > 0, "resize: the size must be positive, got ", height, " x ", width);
  return [height, width](const Tensor& image, Generator&) {
    MG_CHECK(image.dtype() == DType::u8, "resize: expects an (H, W, C) u8 image (apply before to_tensor), got ",
             image.shape(), " ", image.dtype());
    return resize_image(image, height, width);
  };
}

Transform resize(int64_t size) { return resize(size, size); }

Transform random_crop(int64_t size, int64_t padding) {
  MG_CHECK(size > 0 && padding >= 0, "random_crop: needs size > 0 and padding >= 0, got size ", size, " padding ", padding);
  return [size, padding](const Tensor& image, Generator& rng) {
    Layout l = layout_of("random_crop", image);
    const int64_t PH = l.H + 2 * padding, PW = l.W + 2 * padding;
    MG_CHECK(PH >= size && PW >= size, "random_crop: a ", size, " x ", size, " crop does not fit in image ",
             image.shape(), " padded by ", padding);
    const uint64_t at = rng.advance(2);
    const auto top = int64_t(bounded(uint64_t(rng.bits_at(at)) << 32, uint64_t(PH - size + 1)));
    const auto left = int64_t(bounded(uint64_t(rng.bits_at(at + 1)) << 32, uint64_t(PW - size + 1)));
    return crop_flip(image, l, top - padding, left - padding, size, size, false);
  };
}

Transform random_horizontal_flip(double p) {
  MG_CHECK(p >= 0.0 && p <= 1.0, "random_horizontal_flip: p must be in [0, 1], got ", p);
  return [p](const Tensor& image, Generator& rng) {
    Layout l = layout_of("random_horizontal_flip", image);
    const bool flip = double(rng.uniform_at(rng.advance(1))) < p;
    return flip ? crop_flip(image, l, 0, 0, l.H, l.W, true) : image;
  };
}

Transform gray_to_rgb() {
  return [](const Tensor& image, Generator&) {
    Layout l = layout_of("gray_to_rgb", image);
    const int64_t channels = l.hwc ? l.inner : l.outer;
    if (channels == 3) return image;
    MG_CHECK(channels == 1, "gray_to_rgb: expects a 1- or 3-channel image, got shape ", image.shape());
    Tensor x = contiguous(image);
    Tensor out = empty(l.hwc ? Shape{l.H, l.W, 3} : Shape{3, l.H, l.W}, {.dtype = x.dtype(), .device = x.device()});
    const size_t e = x.element_size(), plane = size_t(l.H * l.W);
    const auto* s = static_cast<const char*>(x.data_ptr());
    auto* d = static_cast<char*>(out.data_ptr());
    if (l.hwc) {
      for (size_t i = 0; i < plane; ++i)
        for (size_t c = 0; c < 3; ++c) std::memcpy(d + (i * 3 + c) * e, s + i * e, e);
    } else {
      for (size_t c = 0; c < 3; ++c) std::memcpy(d + c * plane * e, s, plane * e);
    }
    return out;
  };
}

TransformedDataset::TransformedDataset(std::shared_ptr<const Dataset> base, Transform transform, uint64_t seed)
    : base_(std::move(base)), transform_(std::move(transform)), seed_(seed) {
  MG_CHECK(base_ != nullptr, "TransformedDataset: the base dataset is null");
  MG_CHECK(transform_ != nullptr, "TransformedDataset: the transform is empty");
}

Example TransformedDataset::get(int64_t index, int64_t epoch) const {
  Example ex = base_->get(index, epoch);
  Generator rng = transform_generator(seed_, epoch, index);
  ex.input = transform_(ex.input, rng);
  return ex;
}

}  // namespace mg
