// Images as tensors: decode PNG/JPEG/BMP (and GIF, TGA, PNM) files to (H, W, C) u8 with
// stb_image, resize with stb_image_resize, write PNG with stb_image_write (Debian's libstb).
// Pixels land in allocator memory under the current category; a file stb cannot read is an
// error naming the file and stb's reason, never an empty image.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "core/tensor.h"

namespace mg {

struct ImageInfo {
  int height = 0;
  int width = 0;
  int channels = 0;  // as stored in the file
};

// Reads only the header. Throws naming the file when it is missing or not a known image.
ImageInfo read_image_info(const std::string& path);

// -> (H, W, C) u8 on cpu:0. channels: 0 keeps the file's, 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA
// (stb converts). Throws naming the file: missing, unreadable, corrupt or unsupported.
Tensor read_image(const std::string& path, int channels = 0);
// The same from encoded bytes in memory; `name` is used in error messages.
Tensor decode_image(std::span<const uint8_t> bytes, const std::string& name, int channels = 0);

// image: (H, W, C) u8 -> (height, width, C) u8, filtered resampling (stb's default filters).
Tensor resize_image(const Tensor& image, int64_t height, int64_t width);

// image: (H, W, C) or (H, W) u8 with C in 1..4 -> a PNG file (atomic: temporary file + rename).
void write_png(const std::string& path, const Tensor& image);

}  // namespace mg
