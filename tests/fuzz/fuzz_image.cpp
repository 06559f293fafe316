// Fuzz target: image decoding (data/image.cpp over stb_image): every format stb reads, each of
// the requested channel counts (the input's first byte), then a resize of what decoded.
#include <span>

#include "core/error.h"
#include "data/image.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int channels = data[0] % 5;
  try {
    mg::Tensor img = mg::decode_image(std::span<const uint8_t>(data + 1, size - 1), "fuzz-image", channels);
    mg::resize_image(img, 7, 5);
  } catch (const mg::Error&) {
  }
  return 0;
}
