// Images and vision datasets: PNG/BMP write + decode round trips, errors for missing, corrupt
// and truncated files, resize, ImageFolderDataset (class order, labels, bad-image skipping),
// transforms (values, determinism per (seed, epoch, index), both layouts), the gzip IDX reader
// with its corrupt variants, and the real Fashion-MNIST test labels when installed.
#include <catch2/catch.hpp>
#include <stb/stb_image_write.h>
#include <zlib.h>

#include <filesystem>
#include <set>

#include "data/data_loader.h"
#include "data/fashion_mnist.h"
#include "data/image.h"
#include "data/image_folder.h"
#include "data/transforms.h"
#include "data_test_util.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using mg::test::DataTempDir;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// (H, W, C) u8 with pixel (y, x, c) = 20 y + 7 x + 3 c + base.
Tensor pattern(int64_t H, int64_t W, int64_t C, int base = 0) {
  std::vector<double> v;
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int64_t c = 0; c < C; ++c) v.push_back(double((20 * y + 7 * x + 3 * c + base) % 256));
  return from_vector(v, {H, W, C}, {.dtype = DType::u8});
}

std::vector<int64_t> pixels(const Tensor& t) { return t.to_vector<int64_t>(); }

// A gzip file of big-endian u32 words followed by raw bytes.
void write_idx_gz(const std::string& path, const std::vector<uint32_t>& words, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  for (uint32_t w : words) {
    unsigned char be[4] = {uint8_t(w >> 24), uint8_t(w >> 16), uint8_t(w >> 8), uint8_t(w)};
    gzwrite(f, be, 4);
  }
  if (!data.empty()) gzwrite(f, data.data(), unsigned(data.size()));
  gzclose(f);
}

}  // namespace

TEST_CASE("images: PNG and BMP round trips, resize, errors", "[data][image]") {
  DataTempDir tmp("images");
  Tensor img = pattern(5, 7, 3);
  write_png(tmp.file("a.png"), img);
  Tensor back = read_image(tmp.file("a.png"));
  CHECK(back.shape() == Shape{5, 7, 3});
  CHECK(back.dtype() == DType::u8);
  CHECK(pixels(back) == pixels(img));
  ImageInfo info = read_image_info(tmp.file("a.png"));
  CHECK(info.height == 5);
  CHECK(info.width == 7);
  CHECK(info.channels == 3);
  CHECK(read_image(tmp.file("a.png"), 4).shape() == Shape{5, 7, 4});
  CHECK(read_image(tmp.file("a.png"), 1).shape() == Shape{5, 7, 1});
  // BMP through stb_image_write directly.
  Tensor gray = pattern(4, 6, 1);
  REQUIRE(stbi_write_bmp(tmp.file("g.bmp").c_str(), 6, 4, 1, gray.data<uint8_t>()) == 1);
  Tensor g3 = read_image(tmp.file("g.bmp"));  // BMP stores RGB
  REQUIRE(g3.shape() == Shape{4, 6, 3});
  CHECK(pixels(select(g3, 2, 1)) == pixels(select(gray, 2, 0)));
  // In-memory decode.
  std::string png = mg::test::read_bytes(tmp.file("a.png"));
  Tensor mem = decode_image({reinterpret_cast<const uint8_t*>(png.data()), png.size()}, "a.png bytes");
  CHECK(pixels(mem) == pixels(img));

  // Resize: a constant image stays constant, shapes follow the request.
  Tensor flat = full({8, 8, 3}, 77, {.dtype = DType::u8});
  Tensor small = resize_image(flat, 3, 5);
  CHECK(small.shape() == Shape{3, 5, 3});
  for (int64_t p : pixels(small)) CHECK(p == 77);
  CHECK(pixels(resize_image(img, 5, 7)) == pixels(img));

  // Errors name the file and the problem.
  mg::test::write_bytes(tmp.file("junk.png"), "this is not an image at all");
  CHECK_THROWS_WITH(read_image(tmp.file("junk.png")), Contains(tmp.file("junk.png")) && Contains("cannot decode"));
  mg::test::write_bytes(tmp.file("cut.png"), png.substr(0, png.size() / 2));
  CHECK_THROWS_WITH(read_image(tmp.file("cut.png")), Contains(tmp.file("cut.png")) && Contains("cannot decode"));
  CHECK_THROWS_WITH(read_image(tmp.file("missing.png")), Contains(tmp.file("missing.png")) && Contains("does not exist"));
  CHECK_THROWS_WITH(read_image_info(tmp.file("junk.png")), Contains(tmp.file("junk.png")));
  CHECK_THROWS_WITH(write_png(tmp.file("f.png"), zeros({2, 2, 3})), Contains("expects a u8 image"));
  CHECK_THROWS_WITH(read_image(tmp.file("a.png"), 5), Contains("channels must be"));
}

TEST_CASE("ImageFolderDataset: sorted classes, labels, bad images", "[data][image_folder]") {
  DataTempDir tmp("folder");
  const std::string root = tmp.file("root");
  fs::create_directories(root + "/dog");
  fs::create_directories(root + "/cat");
  write_png(root + "/dog/b.png", pattern(4, 4, 3, 100));
  write_png(root + "/dog/a.png", pattern(4, 4, 3, 50));
  write_png(root + "/cat/x.png", pattern(4, 4, 3, 0));
  write_png(root + "/cat/y.png", pattern(6, 5, 1, 9));  // gray, decoded to 3 channels
  mg::test::write_bytes(root + "/cat/notes.txt", "not an image, ignored");
  ImageFolderDataset ds(root);
  CHECK(ds.classes() == std::vector<std::string>{"cat", "dog"});
  REQUIRE(ds.size() == 4);
  CHECK(ds.file(2) == root + "/dog/a.png");
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 4; ++i) labels.push_back(ds.label(i));
  CHECK(labels == std::vector<int64_t>{0, 0, 1, 1});
  Example ex = ds.get(3);
  CHECK(pixels(ex.input) == pixels(pattern(4, 4, 3, 100)));
  CHECK(ex.target.item<int64_t>() == 1);
  CHECK(ds.get(1).input.shape() == Shape{6, 5, 3});

  // Mixed sizes batch after a resize transform.
  auto resized = std::make_shared<TransformedDataset>(std::make_shared<ImageFolderDataset>(root),
                                                      compose({resize(8), to_tensor()}));
  DataLoader loader(resized, {.batch_size = 4});
  Batch b = *loader.next();
  CHECK(b.input.shape() == Shape{4, 3, 8, 8});
  CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1});

  // A corrupt file: an error naming it, or skipped and counted.
  mg::test::write_bytes(root + "/dog/c.png", "\x89PNG\r\n\x1a\n garbage");
  CHECK_THROWS_WITH(ImageFolderDataset(root), Contains(root + "/dog/c.png"));
  ImageFolderDataset skipping(root, {.skip_bad_images = true});
  CHECK(skipping.size() == 4);
  CHECK(skipping.num_skipped() == 1);
  CHECK(skipping.skipped_files() == std::vector<std::string>{root + "/dog/c.png"});

  CHECK_THROWS_WITH(ImageFolderDataset(tmp.file("nowhere")), Contains("does not exist"));
  fs::create_directories(tmp.file("flat"));
  CHECK_THROWS_WITH(ImageFolderDataset(tmp.file("flat")), Contains("no class subfolders"));
}

TEST_CASE("transforms: values and determinism for a seed", "[data][transforms]") {
  Tensor img = pattern(6, 5, 3);  // (H, W, C) u8
  Generator unused;
  Tensor chw = to_tensor()(img, unused);
  REQUIRE(chw.shape() == Shape{3, 6, 5});
  CHECK(chw.dtype() == DType::f32);
  // chw[c, y, x] = img[y, x, c] / 255
  CHECK(select(select(select(chw, 0, 2), 0, 4), 0, 3).item() == Approx((20 * 4 + 7 * 3 + 6) / 255.0));
  Tensor norm = normalize({0.5f, 0.25f, 0.0f}, {0.5f, 0.5f, 2.0f})(chw, unused);
  CHECK(select(select(select(norm, 0, 1), 0, 0), 0, 1).item() == Approx((10 / 255.0 - 0.25) / 0.5).epsilon(1e-5));
  CHECK_THROWS_WITH(normalize({0.5f}, {0.5f})(img, unused), Contains("apply to_tensor first"));

  // Flip with p = 1 mirrors exactly, p = 0 is the identity, in both layouts.
  Generator g0(1);
  Tensor flipped = random_horizontal_flip(1.0)(img, g0);
  CHECK(pixels(select(flipped, 1, 0)) == pixels(select(img, 1, 4)));
  CHECK(pixels(random_horizontal_flip(0.0)(img, g0)) == pixels(img));
  Tensor flipped_chw = random_horizontal_flip(1.0)(chw, g0);
  test::check_close(flipped_chw, to_tensor()(flipped, g0));
  // gray -> 3 channels.
  Tensor gray = pattern(3, 2, 1);
  Tensor rgb = gray_to_rgb()(gray, unused);
  CHECK(rgb.shape() == Shape{3, 2, 3});
  CHECK(pixels(select(rgb, 2, 2)) == pixels(select(gray, 2, 0)));
  CHECK(gray_to_rgb()(to_tensor()(gray, unused), unused).shape() == Shape{3, 3, 2});

  // Random crop: a full-size crop without padding is the identity; with padding the border is 0
  // somewhere; the draw is a pure function of (seed, epoch, index).
  Generator g1(3);
  CHECK(pixels(random_crop(5, 0)(pattern(5, 5, 3), g1)) == pixels(pattern(5, 5, 3)));
  Transform aug = compose({random_crop(5, 2), random_horizontal_flip()});
  std::set<std::vector<int64_t>> seen;
  for (int64_t index = 0; index < 12; ++index) {
    Generator a = transform_generator(7, 1, index), b = transform_generator(7, 1, index);
    std::vector<int64_t> pa = pixels(aug(img, a));
    CHECK(pa == pixels(aug(img, b)));
    seen.insert(pa);
  }
  CHECK(seen.size() > 4);  // different examples get different crops
  // The u8 and float layouts crop the same pixels for the same draws.
  Generator u = transform_generator(5, 0, 0), f = transform_generator(5, 0, 0);
  Tensor crop_u8 = random_crop(4, 1)(img, u);
  Tensor crop_f32 = random_crop(4, 1)(chw, f);
  test::check_close(crop_f32, to_tensor()(crop_u8, u));
  CHECK_THROWS_WITH(random_crop(9, 1)(img, u), Contains("does not fit"));

  // Through a dataset: the same (seed, epoch, index) gives the same example.
  class One : public Dataset {
   public:
    int64_t size() const override { return 3; }
    Example get(int64_t index, int64_t = 0) const override { return {pattern(6, 5, 3, int(index)), Tensor()}; }
  };
  TransformedDataset td(std::make_shared<One>(), compose({random_crop(4, 1), to_tensor()}), 11);
  test::check_close(td.get(2, 4).input, td.get(2, 4).input, 0, 0);
  CHECK(td.get(2, 4).input.shape() == Shape{3, 4, 4});
}

TEST_CASE("IDX reader: tiny gzip files, truncated and bad-magic variants", "[data][fashion_mnist]") {
  DataTempDir tmp("idx");
  std::string pixels12;
  for (int i = 0; i < 12; ++i) pixels12.push_back(char(i * 20));
  write_idx_gz(tmp.file("train-images-idx3-ubyte.gz"), {0x803, 3, 2, 2}, pixels12);
  write_idx_gz(tmp.file("train-labels-idx1-ubyte.gz"), {0x801, 3}, std::string("\x07\x00\x09", 3));
  Tensor images = read_idx_images(tmp.file("train-images-idx3-ubyte.gz"));
  CHECK(images.shape() == Shape{3, 2, 2});
  CHECK(pixels(images)[11] == 220);
  Tensor labels = read_idx_labels(tmp.file("train-labels-idx1-ubyte.gz"));
  CHECK(pixels(labels) == std::vector<int64_t>{7, 0, 9});

  FashionMnistDataset ds(tmp.dir.string(), FashionMnistSplit::train);
  CHECK(ds.size() == 3);
  Example ex = ds.get(1);
  CHECK(ex.input.shape() == Shape{2, 2, 1});
  CHECK(pixels(ex.input) == std::vector<int64_t>{80, 100, 120, 140});
  CHECK(ex.target.item<int64_t>() == 0);
  CHECK(ex.target.dtype() == DType::i64);
  CHECK(std::string(FashionMnistDataset::class_name(9)) == "Ankle boot");

  std::string p = tmp.file("cut.gz");
  write_idx_gz(p, {0x803, 3, 2, 2}, pixels12.substr(0, 10));
  CHECK_THROWS_WITH(read_idx_images(p), Contains(p) && Contains("truncated") && Contains("12 bytes") &&
                                            Contains("only 10 bytes follow"));
  write_idx_gz(p, {0x803, 3}, "");
  CHECK_THROWS_WITH(read_idx_images(p), Contains(p) && Contains("truncated") && Contains("needs 16 bytes"));
  write_idx_gz(p, {0x801, 3, 2, 2}, pixels12);
  CHECK_THROWS_WITH(read_idx_images(p), Contains(p) && Contains("magic number 0x00000801, expected 0x00000803"));
  write_idx_gz(p, {0x803, 3, 2, 2}, pixels12 + "extra");
  CHECK_THROWS_WITH(read_idx_images(p), Contains(p) && Contains("trailing data"));
  CHECK_THROWS_WITH(read_idx_labels(tmp.file("none.gz")), Contains("does not exist"));
  // A gzip stream cut in the middle.
  write_idx_gz(p, {0x803, 3, 2, 2}, pixels12);
  std::string gz = mg::test::read_bytes(p);
  mg::test::write_bytes(p, gz.substr(0, gz.size() - 12));
  CHECK_THROWS_WITH(read_idx_images(p), Contains(p));
  // limit: only the first records are read, into the host data pool unless told otherwise.
  FashionMnistDataset first2(tmp.dir.string(), FashionMnistSplit::train, kHostData, 2);
  CHECK(first2.size() == 2);
  CHECK(first2.images().device() == kHostData);
  CHECK(pixels(first2.get(1).input) == std::vector<int64_t>{80, 100, 120, 140});
  CHECK(read_idx_images(tmp.file("train-images-idx3-ubyte.gz"), kCPU, 5).size(0) == 3);  // a limit beyond the file
  // Counts that disagree between the images and the labels.
  write_idx_gz(tmp.file("train-labels-idx1-ubyte.gz"), {0x801, 2}, std::string("\x01\x02", 2));
  CHECK_THROWS_WITH(FashionMnistDataset(tmp.dir.string()), Contains("has 3 images but") && Contains("has 2 labels"));
}

TEST_CASE("real Fashion-MNIST test labels", "[data][fashion_mnist]") {
  const std::string labels_path = std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz";
  if (!fs::exists(labels_path)) {
    WARN("skipped: " << labels_path << " is missing (Debian package dataset-fashion-mnist)");
    return;
  }
  Tensor labels = read_idx_labels(labels_path);
  REQUIRE(labels.shape() == Shape{10000});
  // The first ten test labels, read with Python's gzip module.
  CHECK(pixels(narrow(labels, 0, 0, 10)) == std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  FashionMnistDataset test(FashionMnistSplit::test);
  CHECK(test.size() == 10000);
  CHECK(test.images().shape() == Shape{10000, 28, 28});
  int64_t sum = 0;
  for (int64_t v : pixels(test.get(0).input)) sum += v;
  CHECK(sum == 33456);  // the first image's pixel sum, also from Python
}
