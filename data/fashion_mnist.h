// Fashion-MNIST (Xiao et al. 2017): 60k train / 10k test 28x28 gray images of 10 clothing
// classes, read from the gzip-compressed IDX files that Debian's dataset-fashion-mnist installs.
// The IDX reader checks the magic, the big-endian dimensions and that exactly the promised
// bytes follow, so a truncated or foreign file is an error naming it, never a partial dataset.
#pragma once
#include <string>

#include "data/dataset.h"

namespace mg {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// IDX files of u8 data, gzip-compressed or plain (zlib reads both), into tensors on `device`
// (a cpu device) under the current memory category. limit > 0 reads only the first `limit`
// records (the rest of the file is not decompressed); 0 reads all and checks nothing trails them.
// images: magic 0x00000803, dims (N, rows, cols) -> (min(N, limit), rows, cols) u8
Tensor read_idx_images(const std::string& path, Device device = kCPU, int64_t limit = 0);
// labels: magic 0x00000801, dim (N) -> (min(N, limit)) u8
Tensor read_idx_labels(const std::string& path, Device device = kCPU, int64_t limit = 0);

enum class FashionMnistSplit { train, test };

class FashionMnistDataset : public Dataset {
 public:
  // Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz into `storage` (category input):
  // by default the host data pool, so the dataset never counts against a training device's
  // budget. limit > 0 keeps (and reads) only the first `limit` examples.
  explicit FashionMnistDataset(std::string dir = kFashionMnistDir, FashionMnistSplit split = FashionMnistSplit::train,
                               Device storage = kHostData, int64_t limit = 0);
  explicit FashionMnistDataset(FashionMnistSplit split) : FashionMnistDataset(kFashionMnistDir, split) {}

  int64_t size() const override { return images_.size(0); }
  // input: (28, 28, 1) u8 (a view of the stored images), target: () i64 class in [0, 10).
  Example get(int64_t index, int64_t epoch = 0) const override;

  const Tensor& images() const { return images_; }  // (N, 28, 28) u8
  const Tensor& labels() const { return labels_; }  // (N) u8
  static constexpr int64_t kNumClasses = 10;
  static const char* class_name(int64_t label);  // "T-shirt/top", "Trouser", ...

 private:
  Tensor images_, labels_;
};

}  // namespace mg
