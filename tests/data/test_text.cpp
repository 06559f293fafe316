// Text data: the byte tokenizer round trip, token files (write/read for every width, each kind
// of corrupt file with its error message), token windows (values, region, reproducibility),
// streaming a 64 MiB token file under a 1 MiB budget, and tokenize_files over a folder.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/allocator.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "data/token_window_dataset.h"
#include "data/tokenizer.h"
#include "data_test_util.h"

using namespace mg;
using mg::test::DataTempDir;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("byte tokenizer round trips bytes and UTF-8", "[data][tokenizer]") {
  ByteTokenizer tok;
  std::string text = "Hello, w\xC3\xB6rld! \x01\xFF\n";  // UTF-8 o-umlaut and edge bytes
  std::vector<uint32_t> ids = tok.encode(text);
  REQUIRE(ids.size() == text.size());
  CHECK(ids[0] == 'H');
  CHECK(ids[8] == 0xC3);
  CHECK(ids[ids.size() - 2] == 0xFF);
  CHECK(tok.decode(ids) == text);
  CHECK(tok.vocab_size() == 256);
  Tensor t = tok.encode_tensor(text);
  CHECK(t.shape() == Shape{1, int64_t(text.size())});
  CHECK(t.dtype() == DType::i64);
  CHECK(tok.decode(t) == text);
  CHECK(tok.encode("").empty());
  std::vector<uint32_t> bad{65, 256};
  CHECK_THROWS_WITH(tok.decode(bad), Contains("token 256 at position 1"));
}

TEST_CASE("token files round trip for widths 1, 2 and 4", "[data][token_file]") {
  DataTempDir tmp("tokens");
  for (int width : {1, 2, 4}) {
    std::vector<uint32_t> tokens;
    uint64_t max = width == 4 ? 0xFFFFFFFFull : (1ull << (8 * width)) - 1;
    for (uint64_t i = 0; i < 1000; ++i) tokens.push_back(uint32_t((i * 2654435761ull) % (max + 1)));
    tokens.push_back(uint32_t(max));
    std::string path = tmp.file(std::to_string(width) + "_bytes.tok");
    write_token_file(path, tokens, width);
    CHECK(fs::file_size(path) == 24 + tokens.size() * size_t(width) + 8);  // + the checksum
    TokenFile f(path);
    CHECK(f.size() == int64_t(tokens.size()));
    CHECK(f.width() == width);
    CHECK(f.read(0, f.size()) == tokens);
    CHECK(f[1000] == max);
    std::vector<int64_t> window(5);
    f.read(10, 5, window.data());
    for (int i = 0; i < 5; ++i) CHECK(window[size_t(i)] == int64_t(tokens[size_t(10 + i)]));
    CHECK_THROWS_WITH(f.read(999, 5), Contains("outside the file's 1001 tokens"));
  }
  // Little-endian layout, written by hand: "MGTOKENS", version 2, width 2, count 2, 0x0102 0x0304,
  // then the XXH3-64 of the 4 token bytes.
  std::string path = tmp.file("le.tok");
  write_token_file(path, std::vector<uint32_t>{0x0102, 0x0304}, 2);
  std::string want("MGTOKENS\x02\0\0\0\x02\0\0\0\x02\0\0\0\0\0\0\0\x02\x01\x04\x03", 28);
  const uint64_t sum = checksum64("\x02\x01\x04\x03", 4);
  for (int i = 0; i < 8; ++i) want += char((sum >> (8 * i)) & 0xff);
  CHECK(mg::test::read_bytes(path) == want);
  // A version-1 file (no checksum) still opens.
  std::string v1 = want.substr(0, 28);
  v1[8] = 1;
  mg::test::write_bytes(tmp.file("v1.tok"), v1);
  CHECK(TokenFile(tmp.file("v1.tok")).read(0, 2) == std::vector<uint32_t>{0x0102, 0x0304});
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(tmp.dir)) CHECK(e.path().string().find(".tmp.") == std::string::npos);
  // A token that does not fit is an error, and the failed write leaves no file.
  CHECK_THROWS_WITH(write_token_file(tmp.file("big.tok"), std::vector<uint32_t>{1, 300}, 1),
                    Contains("token 300 at position 1 does not fit in 1 byte"));
  CHECK_FALSE(fs::exists(tmp.file("big.tok")));
  CHECK_THROWS_WITH(write_token_file(tmp.file("w3.tok"), std::vector<uint32_t>{1}, 3), Contains("width must be 1, 2 or 4"));
}

TEST_CASE("corrupt token files give errors naming the file and the problem", "[data][token_file]") {
  DataTempDir tmp("badtokens");
  std::string good = tmp.file("good.tok");
  write_token_file(good, std::vector<uint32_t>{1, 2, 3, 4}, 2);
  const std::string bytes = mg::test::read_bytes(good);  // 24 + 8 + 8 bytes
  auto variant = [&](const std::string& name, std::string b) {
    std::string p = tmp.file(name);
    mg::test::write_bytes(p, b);
    return p;
  };
  auto expect_error = [](const std::string& path, const std::string& what) {
    INFO(path);
    CHECK_THROWS_WITH(TokenFile(path), Contains(path) && Contains(what));
  };
  std::string b = bytes;
  b[0] = 'X';
  expect_error(variant("magic.tok", b), "bad magic number");
  b = bytes;
  b[8] = 3;
  expect_error(variant("version.tok", b), "has version 3, this memgrad reads versions 1 and 2");
  b = bytes;
  b[12] = 3;
  expect_error(variant("width.tok", b), "token width 3 bytes");
  expect_error(variant("truncated.tok", bytes.substr(0, bytes.size() - 1)),
               "is truncated: the header says 4 tokens of 2 byte(s), so the file should have 40 bytes, but it has 39");
  expect_error(variant("trailing.tok", bytes + "x"), "1 trailing bytes");
  expect_error(variant("empty.tok", ""), "the file is empty");
  expect_error(variant("short.tok", bytes.substr(0, 10)), "too short for a token file: 10 bytes");
  b = bytes.substr(0, 24) + bytes.substr(32, 8);
  for (int i = 16; i < 24; ++i) b[size_t(i)] = 0;
  expect_error(variant("zero.tok", b), "contains no tokens");
  expect_error(tmp.file("missing.tok"), "cannot open");
}

TEST_CASE("token files: every single-bit flip in the tokens or the checksum is detected", "[data][token_file][checksum]") {
  DataTempDir tmp("tokenflips");
  std::string good = tmp.file("good.tok");
  std::vector<uint32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(i * 37 % 251);
  write_token_file(good, tokens, 1);
  const std::string bytes = mg::test::read_bytes(good);
  REQUIRE(bytes.size() == 24 + 40 + 8);
  int detected = 0, flips = 0;
  for (size_t byte = 24; byte < bytes.size(); ++byte)
    for (int bit = 0; bit < 8; ++bit, ++flips) {
      std::string b = bytes;
      b[byte] = char(b[byte] ^ (1 << bit));
      std::string p = tmp.file("flip.tok");
      mg::test::write_bytes(p, b);
      try {
        TokenFile f(p);
      } catch (const Error& e) {
        detected += std::string(e.what()).find("is corrupt") != std::string::npos;
      }
    }
  CHECK(flips == 48 * 8);
  CHECK(detected == flips);
}

TEST_CASE("token windows: values, region, reproducible sampling", "[data][token_file]") {
  DataTempDir tmp("windows");
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(i % 251);
  std::string path = tmp.file("w.tok");
  write_token_file(path, tokens, 1);
  auto file = std::make_shared<const TokenFile>(path);
  auto [train, val] = split_train_val(file->size(), 0.1);
  CHECK(train.begin == 0);
  CHECK(train.end == 900);
  CHECK(val.begin == 900);
  CHECK(val.end == 1000);

  TokenWindowDataset ds(file, {.context = 16, .region = train, .seed = 7});
  CHECK(ds.size() == (900 - 1) / 16);
  std::set<int64_t> starts;
  for (int64_t i = 0; i < ds.size(); ++i) {
    int64_t s = ds.window_start(i, 3);
    CHECK(s == ds.window_start(i, 3));  // a pure function of (seed, epoch, index)
    CHECK(s >= 0);
    CHECK(s + 16 < 900);  // y's last token stays inside the region
    starts.insert(s);
  }
  CHECK(starts.size() > 40);  // spread, not one position
  CHECK(ds.window_start(0, 0) != ds.window_start(0, 1));
  TokenWindowDataset other_seed(file, {.context = 16, .region = train, .seed = 8});
  CHECK(other_seed.window_start(0, 0) != ds.window_start(0, 0));

  Example ex = ds.get(5, 2);
  int64_t s = ds.window_start(5, 2);
  REQUIRE(ex.input.shape() == Shape{16});
  REQUIRE(ex.target.shape() == Shape{16});
  std::vector<int64_t> x = ex.input.to_vector<int64_t>(), y = ex.target.to_vector<int64_t>();
  for (int64_t t = 0; t < 16; ++t) {
    CHECK(x[size_t(t)] == int64_t(tokens[size_t(s + t)]));
    CHECK(y[size_t(t)] == int64_t(tokens[size_t(s + t + 1)]));
  }
  // Sequential validation windows cover the region in order.
  TokenWindowDataset vds(file, {.context = 16, .region = val, .random = false});
  CHECK(vds.size() == (100 - 1) / 16);
  CHECK(vds.window_start(0) == 900);
  CHECK(vds.window_start(2) == 932);
  CHECK_THROWS_WITH(TokenWindowDataset(file, {.context = 100, .region = val}),
                    Contains("has 100 tokens, but a window of context 100 needs 101"));
  CHECK_THROWS_WITH(TokenWindowDataset(file, {.context = 8, .region = {0, 2000}}), Contains("outside"));
}

TEST_CASE("streaming a 64 MiB token file keeps memory flat under a 1 MiB budget", "[data][token_file]") {
  DataTempDir tmp("stream");
  const std::string path = tmp.file("big.tok");
  const int64_t n = 32 << 20;  // 32 Mi tokens x 2 bytes = 64 MiB
  {
    TokenFileWriter w(path, 2);
    std::vector<uint32_t> chunk(1 << 20);
    for (int64_t start = 0; start < n; start += int64_t(chunk.size())) {
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = uint32_t((start + int64_t(i)) * 7919 % 65521);
      w.append(chunk);
    }
    w.finish();
  }
  REQUIRE(fs::file_size(path) == size_t(24 + 2 * n + 8));
  const Device dev("cpu:13");
  set_memory_limit(dev, 1 << 20);
  reset_peak_stats(dev);
  const int64_t rss_before = mg::test::resident_bytes();
  {
    auto file = std::make_shared<const TokenFile>(path);
    auto ds = std::make_shared<TokenWindowDataset>(file, TokenWindowOptions{.context = 128, .region = {}, .seed = 1});
    DataLoader loader(ds, {.batch_size = 8, .seed = 1, .prefetch = 2, .device = dev});
    for (int step = 0; step < 40; ++step) {
      Batch b = loader.next_step();
      REQUIRE(b.input.shape() == Shape{8, 128});
      REQUIRE(b.input.device() == dev);
      if (step == 39) {  // the rows are the windows the dataset promises
        std::vector<int64_t> x = b.input.to_vector<int64_t>(), y = b.target.to_vector<int64_t>();
        for (int64_t r = 0; r < 8; ++r) {
          int64_t s = ds->window_start(39 * 8 + r);
          CHECK(x[size_t(r * 128)] == s * 7919 % 65521);
          CHECK(y[size_t(r * 128 + 127)] == (s + 128) * 7919 % 65521);
        }
      }
    }
  }
  const int64_t rss_growth = mg::test::resident_bytes() - rss_before;
  MemoryStats st = memory_stats(dev);
  set_memory_limit(dev, 0);
  // (prefetch 2 + 1 held) batches of x and y, 8 KiB each: far below the 64 MiB file.
  CHECK(st.category(MemoryCategory::input).peak <= 3 * 2 * 8 * 128 * 8);
  CHECK(st.allocated.peak <= (1 << 20));
  CHECK(st.num_ooms == 0);
  CHECK(st.allocated.current == 0);
  INFO("resident memory grew by " << rss_growth << " bytes");
  CHECK(rss_growth < (16 << 20));  // windows only, never the whole mapping
}

TEST_CASE("tokenize_files concatenates a folder sorted by name, skipping .dat and links", "[data][token_file]") {
  DataTempDir tmp("corpus");
  mg::test::write_bytes(tmp.file("src/b.txt"), "bee\n");
  mg::test::write_bytes(tmp.file("src/a.txt"), "h\xC3\xA9llo\n");  // UTF-8 passes through
  mg::test::write_bytes(tmp.file("src/a.dat"), "INDEX");
  mg::test::write_bytes(tmp.file("src/sub/c"), "sea");
  fs::create_symlink("a.txt", tmp.file("src/a.u8"));
  std::string out = tmp.file("corpus.tok");
  TokenizeSummary s = tokenize_files({tmp.file("src")}, out);
  CHECK(s.files == 3);
  CHECK(s.tokens == 7 + 4 + 3);
  TokenFile f(out);
  CHECK(f.width() == 1);
  CHECK(ByteTokenizer().decode(f.read(0, f.size())) == "h\xC3\xA9llo\nbee\nsea");
  // Explicit files keep their order.
  s = tokenize_files({tmp.file("src/b.txt"), tmp.file("src/a.txt")}, out);
  CHECK(ByteTokenizer().decode(TokenFile(out).read(0, s.tokens)) == "bee\nh\xC3\xA9llo\n");

  mg::test::write_bytes(tmp.file("empty/x.txt"), "");
  std::string empty_out = tmp.file("empty.tok");
  CHECK_THROWS_WITH(tokenize_files({tmp.file("empty")}, empty_out), Contains("corpus is empty"));
  CHECK_FALSE(fs::exists(empty_out));
  CHECK_THROWS_WITH(tokenize_files({tmp.file("nope")}, empty_out), Contains(tmp.file("nope")) && Contains("does not exist"));

  const std::string fortunes = "/usr/share/games/fortunes";
  if (!fs::is_directory(fortunes)) {
    WARN("skipped the fortunes corpus check: " << fortunes << " is missing (Debian package fortunes)");
    return;
  }
  int64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(fortunes))
    if (!e.is_symlink() && e.is_regular_file() && e.path().extension() != ".dat") bytes += int64_t(e.file_size());
  s = tokenize_files({fortunes}, out);
  CHECK(s.tokens == bytes);
  CHECK(TokenFile(out).size() == bytes);
}
