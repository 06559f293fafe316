// Image decode / resize / write through stb (see image.h). stb allocates its own scratch
// memory with malloc while decoding or resizing (the Debian library is compiled that way); it
// is freed before these functions return, and the pixels kept are copied into a tensor.
#include "data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "ops/ops.h"

namespace mg {

namespace {

void check_exists(const char* op, const std::string& path) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  MG_CHECK(std::filesystem::exists(st), op, ": '", path, "' does not exist");
  MG_CHECK(!std::filesystem::is_directory(st), op, ": '", path, "' is a directory, not an image file");
}

void check_channels(const char* op, int channels) {
  MG_CHECK(channels >= 0 && channels <= 4, op, ": channels must be 0 (as in the file) or 1..4, got ", channels);
}

const char* reason() {
  const char* r = stbi_failure_reason();
  return r ? r : "unknown error";
}

// Images up to 2^26 pixels (8192 x 8192): memgrad's datasets are far smaller, and stb's own
// buffer (outside the allocator) stays under 256 MiB.
constexpr int64_t kMaxImagePixels = int64_t(1) << 26;
void check_pixel_count(const char* op, const std::string& name, int w, int h) {
  MG_CHECK(int64_t(w) * int64_t(h) <= kMaxImagePixels, op, ": '", name, "' is ", w, "x", h,
           " pixels, more than memgrad's limit of ", kMaxImagePixels, " (corrupt header?)");
}

// stb reserves a PNG chunk's claimed length before reading it (1.2 GB for a 90-byte file found by
// tests/fuzz/fuzz_image.cpp): every chunk of an in-memory PNG must fit in the bytes given.
void check_png_chunks(std::span<const uint8_t> b, const std::string& name) {
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() < 8 || std::memcmp(b.data(), kSig, 8) != 0) return;
  for (size_t at = 8; at + 8 <= b.size();) {
    const uint64_t len = (uint64_t(b[at]) << 24) | (uint64_t(b[at + 1]) << 16) | (uint64_t(b[at + 2]) << 8) | b[at + 3];
    MG_CHECK(at + 12 + len <= b.size(), "decode_image: '", name, "' is a corrupt PNG: a chunk of ", len,
             " bytes at offset ", at, " runs past the end of the ", b.size(), "-byte file");
    if (std::memcmp(b.data() + at + 4, "IEND", 4) == 0) return;
    at += 12 + len;
  }
}

// Copies stb's pixels into a tensor and frees them. stb accepts a header of width or height 0
// (found by tests/fuzz/fuzz_image.cpp): an error here, not an empty image.
Tensor adopt_pixels(unsigned char* pixels, int w, int h, int c, const char* op, const std::string& name) {
  std::unique_ptr<unsigned char, void (*)(void*)> owner(pixels, stbi_image_free);
  MG_CHECK(w > 0 && h > 0 && c > 0, op, ": '", name, "' is an empty image (", w, "x", h, ", ", c, " channels)");
  Tensor img = empty({h, w, c}, {.dtype = DType::u8});  // (H, W, C)
  std::memcpy(img.data<uint8_t>(), pixels, size_t(h) * size_t(w) * size_t(c));
  return img;
}

// (H, W, C) u8 on a cpu device, with C in 1..4; a 2-D image counts as C = 1.
Tensor as_hwc_u8(const char* op, const Tensor& image) {
  MG_CHECK(image.dtype() == DType::u8, op, ": expects a u8 image, got ", image.dtype());
  MG_CHECK(image.device().is_cpu(), op, ": expects an image on a cpu device, got ", image.device().str());
  MG_CHECK(image.dim() == 2 || image.dim() == 3, op, ": expects an (H, W, C) or (H, W) image, got shape ", image.shape());
  Tensor x = image.dim() == 2 ? unsqueeze(image, 2) : image;
  MG_CHECK(x.size(2) >= 1 && x.size(2) <= 4, op, ": expects 1 to 4 channels (H, W, C), got shape ", image.shape());
  MG_CHECK(x.size(0) > 0 && x.size(1) > 0, op, ": the image is empty: shape ", image.shape());
  return contiguous(x);
}

}  // namespace

ImageInfo read_image_info(const std::string& path) {
  check_exists("read_image_info", path);
  ImageInfo info;
  MG_CHECK(stbi_info(path.c_str(), &info.width, &info.height, &info.channels) == 1, "read_image_info: cannot read '",
           path, "' as an image: ", reason(), "\n  hint: PNG, JPEG, BMP, GIF, TGA and PNM files are supported");
  return info;
}

Tensor read_image(const std::string& path, int channels) {
  check_channels("read_image", channels);
  check_exists("read_image", path);
  int w = 0, h = 0, c = 0;
  MG_CHECK(stbi_info(path.c_str(), &w, &h, &c) == 1, "read_image: cannot decode '", path, "': ", reason(),
           "\n  hint: PNG, JPEG, BMP, GIF, TGA and PNM files are supported");
  check_pixel_count("read_image", path, w, h);
  unsigned char* pixels = stbi_load(path.c_str(), &w, &h, &c, channels);
  MG_CHECK(pixels != nullptr, "read_image: cannot decode '", path, "': ", reason(),
           "\n  hint: PNG, JPEG, BMP, GIF, TGA and PNM files are supported");
  return adopt_pixels(pixels, w, h, channels ? channels : c, "read_image", path);
}

Tensor decode_image(std::span<const uint8_t> bytes, const std::string& name, int channels) {
  check_channels("decode_image", channels);
  MG_CHECK(!bytes.empty(), "decode_image: '", name, "' is empty (0 bytes)");
  MG_CHECK(bytes.size() <= size_t(INT32_MAX), "decode_image: '", name, "' is too large (", bytes.size(), " bytes)");
  int w = 0, h = 0, c = 0;
  // stb allocates whatever the header claims; refuse giant images before it does (tests/fuzz/fuzz_image.cpp).
  check_png_chunks(bytes, name);
  MG_CHECK(stbi_info_from_memory(bytes.data(), int(bytes.size()), &w, &h, &c) == 1, "decode_image: cannot decode '",
           name, "': ", reason());
  check_pixel_count("decode_image", name, w, h);
  unsigned char* pixels = stbi_load_from_memory(bytes.data(), int(bytes.size()), &w, &h, &c, channels);
  MG_CHECK(pixels != nullptr, "decode_image: cannot decode '", name, "': ", reason());
  return adopt_pixels(pixels, w, h, channels ? channels : c, "decode_image", name);
}

Tensor resize_image(const Tensor& image, int64_t height, int64_t width) {
  Tensor x = as_hwc_u8("resize_image", image);  // (H, W, C)
  MG_CHECK(height > 0 && width > 0 && height <= INT32_MAX && width <= INT32_MAX,
           "resize_image: the target size must be positive, got ", height, " x ", width);
  const int64_t H = x.size(0), W = x.size(1), C = x.size(2);
  Tensor out = empty({height, width, C}, {.dtype = DType::u8, .device = x.device()});  // (h, w, C)
  if (H == height && W == width) {
    copy_(out, x);
    return out;
  }
  int ok = stbir_resize_uint8(x.data<uint8_t>(), int(W), int(H), 0, out.data<uint8_t>(), int(width), int(height), 0,
                              int(C));
  MG_CHECK(ok == 1, "resize_image: stb_image_resize failed for ", x.shape(), " -> (", height, ", ", width, ", ", C, ")");
  return out;
}

void write_png(const std::string& path, const Tensor& image) {
  Tensor x = as_hwc_u8("write_png", image);  // (H, W, C)
  const int H = int(x.size(0)), W = int(x.size(1)), C = int(x.size(2));
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int ok = stbi_write_png(tmp.c_str(), W, H, C, x.data<uint8_t>(), W * C);
  if (ok == 0) {
    std::remove(tmp.c_str());
    MG_THROW("write_png: cannot write '", path, "' (writing the temporary file '", tmp, "' failed)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    MG_THROW("write_png: cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
}

}  // namespace mg
