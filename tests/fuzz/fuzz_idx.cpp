// Fuzz target: Fashion-MNIST IDX files (data/fashion_mnist.cpp), plain and gzip-compressed
// (chosen by the input's first byte), images and labels, with and without a record limit.
#include "core/error.h"
#include "data/fashion_mnist.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string path = mg::fuzz::write_input((mode & 1) ? "f-idx.gz" : "f-idx", data + 1, size - 1);
  const int64_t limit = (mode & 2) ? int64_t(mode >> 2) : 0;
  try {
    if (mode & 0x80) mg::read_idx_labels(path, mg::kCPU, limit);
    else mg::read_idx_images(path, mg::kCPU, limit);
  } catch (const mg::Error&) {
  }
  return 0;
}
