// ImageFolderDataset (see image_folder.h): scanning root/<class>/<file>, validating the files,
// and decoding one example at a time.
#include "data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "data/image.h"

namespace mg {

namespace fs = std::filesystem;

bool has_image_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const char* e : {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".ppm", ".pgm", ".pnm"})
    if (ext == e) return true;
  return false;
}

ImageFolderDataset::ImageFolderDataset(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), opt_(options) {
  MG_CHECK(opt_.channels >= 0 && opt_.channels <= 4, "ImageFolderDataset: channels must be 0..4, got ", opt_.channels);
  std::error_code ec;
  MG_CHECK(fs::is_directory(root_, ec), "ImageFolderDataset: '", root_, "' does not exist or is not a directory");
  for (const auto& entry : fs::directory_iterator(root_, ec))
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  MG_CHECK(!ec, "ImageFolderDataset: cannot list '", root_, "': ", ec.message());
  MG_CHECK(!classes_.empty(), "ImageFolderDataset: '", root_, "' has no class subfolders",
           "\n  hint: the layout is root/<class name>/<image file>");
  std::sort(classes_.begin(), classes_.end());

  constexpr int kMaxWarnings = 10;
  int64_t total = 0;
  for (size_t label = 0; label < classes_.size(); ++label) {
    const std::string dir = root_ + "/" + classes_[label];
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_regular_file() && has_image_extension(entry.path().string())) names.push_back(entry.path().string());
    MG_CHECK(!ec, "ImageFolderDataset: cannot list '", dir, "': ", ec.message());
    MG_CHECK(!names.empty(), "ImageFolderDataset: class folder '", dir, "' has no image files (",
             ".png .jpg .jpeg .bmp .gif .tga .ppm .pgm .pnm)");
    std::sort(names.begin(), names.end());
    for (std::string& path : names) {
      ++total;
      if (!opt_.skip_bad_images) {
        read_image_info(path);  // throws naming the file
      } else {
        try {
          read_image(path, opt_.channels);
        } catch (const Error& e) {
          if (int64_t(skipped_.size()) < kMaxWarnings)
            std::cerr << "memgrad: warning: ImageFolderDataset: skipping a bad image: " << e.what() << "\n";
          skipped_.push_back(path);
          continue;
        }
      }
      files_.push_back(std::move(path));
      labels_.push_back(int64_t(label));
    }
  }
  if (!skipped_.empty())
    std::cerr << "memgrad: warning: ImageFolderDataset: skipped " << skipped_.size() << " of " << total
              << " images under '" << root_ << "'\n";
  MG_CHECK(!files_.empty(), "ImageFolderDataset: none of the ", total, " images under '", root_, "' could be decoded");
}

Example ImageFolderDataset::get(int64_t index, int64_t) const {
  MG_CHECK(index >= 0 && index < size(), "ImageFolderDataset: index ", index, " is outside [0, ", size(), ")");
  Tensor image = read_image(files_[size_t(index)], opt_.channels);  // (H, W, C) u8
  return {image, scalar_tensor(double(labels_[size_t(index)]), {.dtype = DType::i64})};
}

}  // namespace mg
