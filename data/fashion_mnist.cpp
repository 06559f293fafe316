// Fashion-MNIST and its IDX reader (see fashion_mnist.h). The files are read through zlib's
// gzread straight into the destination tensor, so the decompressed data is never held twice.
#include "data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/memory_category.h"

namespace mg {

namespace {

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    std::error_code ec;
    MG_CHECK(std::filesystem::is_regular_file(path, ec), "read_idx: '", path, "' does not exist or is not a file",
             "\n  hint: Fashion-MNIST comes with Debian's dataset-fashion-mnist (scripts/setup installs it)");
    f_ = gzopen(path.c_str(), "rb");
    MG_CHECK(f_ != nullptr, "read_idx: cannot open '", path, "'");
  }
  ~GzFile() {
    if (f_) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; returns how many arrived (fewer only at the end of the data).
  // A corrupt gzip stream is an error naming the file and zlib's reason.
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      auto chunk = unsigned(std::min<size_t>(n - done, size_t(1) << 30));
      int got = gzread(f_, static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(f_, &code);
        MG_THROW("read_idx: '", path_, "' is corrupt: ", msg ? msg : "gzip read error", " (after ", done, " of ", n,
                 " bytes)");
      }
      if (got == 0) break;
      done += size_t(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

uint32_t big_endian_u32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// The IDX format: u32 magic 0x000008NN (u8 data, NN dims), NN big-endian u32 dims, the data.
Tensor read_idx(const std::string& path, int ndim, const char* what, Device device, int64_t limit) {
  MG_CHECK(limit >= 0, "read_idx: limit must be >= 0, got ", limit);
  MG_CHECK(device.is_cpu(), "read_idx: '", path, "' can only be read into a cpu device, got ", device.str());
  GzFile f(path);
  unsigned char header[16];
  const size_t header_bytes = 4 + 4 * size_t(ndim);
  size_t got = f.read(header, header_bytes);
  MG_CHECK(got == header_bytes, "read_idx: '", path, "' is truncated: the IDX header of ", what, " needs ",
           header_bytes, " bytes, the file has ", got);
  const uint32_t magic = big_endian_u32(header), expected = 0x00000800u | uint32_t(ndim);
  if (magic != expected) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "has magic number 0x%08x, expected 0x%08x", magic, expected);
    MG_THROW("read_idx: '", path, "' ", buf, " (an IDX file of ", what, ")",
             (magic >> 16) != 0 ? "; it is not an IDX file" : "");
  }
  Shape shape;
  uint64_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    shape.push_back(int64_t(big_endian_u32(header + 4 + 4 * d)));
    total *= uint64_t(shape.back());
    MG_CHECK(total < (uint64_t(1) << 40), "read_idx: '", path, "' has implausible dimensions ", shape);
  }
  const bool partial = limit > 0 && limit < shape[0];
  if (partial) {
    total = total / uint64_t(shape[0]) * uint64_t(limit);
    shape[0] = limit;
  }
  Tensor out = empty(shape, {.dtype = DType::u8, .device = device});
  got = f.read(out.data_ptr(), size_t(total));
  MG_CHECK(got == total, "read_idx: '", path, "' is truncated: the header promises ", shape, " ", what, ", i.e. ",
           total, " bytes after the ", header_bytes, "-byte header, but only ", got, " bytes follow");
  if (partial) return out;
  unsigned char extra;
  MG_CHECK(f.read(&extra, 1) == 0, "read_idx: '", path, "' has trailing data after the ", total,
           " bytes its header promises (", shape, " ", what, ")");
  return out;
}

}  // namespace

Tensor read_idx_images(const std::string& path, Device device, int64_t limit) {
  return read_idx(path, 3, "images", device, limit);
}
Tensor read_idx_labels(const std::string& path, Device device, int64_t limit) {
  return read_idx(path, 1, "labels", device, limit);
}

FashionMnistDataset::FashionMnistDataset(std::string dir, FashionMnistSplit split, Device storage, int64_t limit) {
  MemoryCategoryGuard category(MemoryCategory::input);
  const std::string prefix = dir + "/" + (split == FashionMnistSplit::train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz", labels_path = prefix + "-labels-idx1-ubyte.gz";
  images_ = read_idx_images(images_path, storage, limit);
  labels_ = read_idx_labels(labels_path, storage, limit);
  MG_CHECK(images_.size(0) == labels_.size(0), "FashionMnistDataset: '", images_path, "' has ", images_.size(0),
           " images but '", labels_path, "' has ", labels_.size(0), " labels");
  MG_CHECK(images_.size(0) > 0, "FashionMnistDataset: '", images_path, "' holds no images");
  const uint8_t* l = labels_.data<uint8_t>();
  for (int64_t i = 0; i < labels_.size(0); ++i)
    MG_CHECK(l[i] < kNumClasses, "FashionMnistDataset: '", labels_path, "' has label ", int(l[i]), " at index ", i,
             ", outside [0, ", kNumClasses, ")");
}

Example FashionMnistDataset::get(int64_t index, int64_t) const {
  MG_CHECK(index >= 0 && index < size(), "FashionMnistDataset: index ", index, " is outside [0, ", size(), ")");
  const int64_t R = images_.size(1), C = images_.size(2);
  Tensor image = images_.as_strided({R, C, 1}, {C, 1, 1}, index * R * C);  // (28, 28, 1) view
  Tensor label = scalar_tensor(double(labels_.data<uint8_t>()[index]), {.dtype = DType::i64});
  return {image, label};
}

const char* FashionMnistDataset::class_name(int64_t label) {
  static const char* names[kNumClasses] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                           "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  MG_CHECK(label >= 0 && label < kNumClasses, "FashionMnistDataset::class_name: label ", label, " is outside [0, 10)");
  return names[label];
}

}  // namespace mg
