// ImageFolderDataset: images stored as root/<class>/<file>, one subfolder per class (the
// torchvision ImageFolder layout). Classes are the subfolder names sorted, so label i is the
// i-th name; files within a class are sorted too, so indices are stable across runs. Images are
// decoded when an example is read (the DataLoader's thread), not held in memory.
#pragma once
#include <string>
#include <vector>

#include "data/dataset.h"

namespace mg {

struct ImageFolderOptions {
  int channels = 3;  // decode to this many channels (0: as stored)
  // false: every file's header is checked at construction and a bad one is an error naming it.
  // true: every file is fully decoded once at construction; bad ones are skipped with a
  // warning on stderr and counted (num_skipped()).
  bool skip_bad_images = false;
};

class ImageFolderDataset : public Dataset {
 public:
  explicit ImageFolderDataset(std::string root, ImageFolderOptions options = {});
  int64_t size() const override { return int64_t(files_.size()); }
  // input: (H, W, C) u8 as decoded (apply a resize transform to batch images of mixed sizes),
  // target: () i64 class index.
  Example get(int64_t index, int64_t epoch = 0) const override;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t index) const { return files_.at(size_t(index)); }
  int64_t label(int64_t index) const { return labels_.at(size_t(index)); }
  int64_t num_skipped() const { return int64_t(skipped_.size()); }
  const std::vector<std::string>& skipped_files() const { return skipped_; }

 private:
  std::string root_;
  ImageFolderOptions opt_;
  std::vector<std::string> classes_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
  std::vector<std::string> skipped_;
};

// True for the extensions stb_image decodes (.png .jpg .jpeg .bmp .gif .tga .ppm .pgm .pnm),
// in any letter case.
bool has_image_extension(const std::string& path);

}  // namespace mg
