// Checksums (core/checksum.h) and the safetensors files that carry them: XXH3 against its
// published value, streaming equal to one-shot, every single-bit flip of tensor data detected
// with the file and the tensor named, no flip anywhere in the file giving silently wrong tensors,
// inconsistent checksum entries refused, and files without checksums (other tools') still loading.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/tensor.h"

using namespace mg;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

struct ChecksumTempDir {
  fs::path dir = fs::path("/tmp") / ("mg_checksum_" + std::to_string(::getpid()));
  ChecksumTempDir() { fs::create_directories(dir); }
  ~ChecksumTempDir() { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Tensors of several dtypes and sizes, random non-zero values, one empty.
NamedTensors sample_tensors() {
  Generator g(17);
  auto normal = [&](int n, uint64_t at) {
    std::vector<double> v;
    for (int i = 0; i < n; ++i) v.push_back(g.normal_at(at + uint64_t(i)));
    return v;
  };
  return {{"a.weight", from_vector(normal(12, 0), {3, 4}, {})},
          {"b.half", from_vector(normal(5, 100), {5}, {.dtype = DType::f16})},
          {"c.step", from_vector(std::vector<double>{7, -123456789}, {2}, {.dtype = DType::i64})},
          {"d.bytes", from_vector(std::vector<double>{1, 2, 3, 250, 9, 0, 77}, {7}, {.dtype = DType::u8})},
          {"e.empty", zeros({0, 3})}};
}

uint64_t header_bytes(const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(file[size_t(i)])) << (8 * i);
  return 8 + n;
}

bool same_tensors(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& na = a[i].first;  // not a structured binding: clang 14 cannot capture one
    const Tensor& ta = a[i].second;
    auto it = std::find_if(b.begin(), b.end(), [&](const auto& e) { return e.first == na; });
    if (it == b.end() || it->second.dtype() != ta.dtype() || it->second.shape() != ta.shape()) return false;
    if (ta.nbytes() && std::memcmp(ta.data_ptr(), it->second.data_ptr(), ta.nbytes()) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("checksum: XXH3-64 published value, streaming equals one-shot, hex round trip", "[checksum]") {
  CHECK(checksum64("", 0) == 0x2D06800538D394C2ULL);  // XXH3_64bits of no bytes (xxHash's test vector)
  std::string text(10000, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = char(i * 131 % 251);
  Checksummer s;
  for (size_t at = 0; at < text.size(); at += 777) s.update(text.data() + at, std::min<size_t>(777, text.size() - at));
  CHECK(s.digest() == checksum64(text.data(), text.size()));
  CHECK(checksum64(text.data(), text.size()) != checksum64(text.data(), text.size() - 1));
  CHECK(checksum_hex(0x2D06800538D394C2ULL) == "2d06800538d394c2");
  CHECK(parse_checksum_hex("2d06800538d394c2") == 0x2D06800538D394C2ULL);
  CHECK(checksum_hex(5) == "0000000000000005");
  CHECK_FALSE(parse_checksum_hex("2d06800538d394c").has_value());   // 15 digits
  CHECK_FALSE(parse_checksum_hex("2D06800538D394C2").has_value());  // upper case is not what we write
  CHECK_FALSE(parse_checksum_hex("2d06800538d394cg").has_value());
}

TEST_CASE("safetensors checksums: every single-bit flip of tensor data is detected, naming file and tensor",
          "[safetensors][checksum]") {
  ChecksumTempDir tmp;
  const std::string path = tmp.file("flips.safetensors");
  const NamedTensors tensors = sample_tensors();
  save_safetensors(path, tensors, {{"format", "pt"}});
  const std::string good = read_all(path);
  const uint64_t data_start = header_bytes(good);
  REQUIRE(same_tensors(load_safetensors(path), tensors));
  CHECK(load_safetensors_metadata(path) == std::map<std::string, std::string>{{"format", "pt"}});

  // Which tensor holds each byte of the data section (the writer packs them in order).
  std::vector<std::string> owner;
  for (const auto& [name, t] : tensors) owner.insert(owner.end(), size_t(t.nbytes()), name);
  REQUIRE(data_start + owner.size() == good.size());

  const std::string flipped = tmp.file("flipped.safetensors");
  int64_t flips = 0, detected = 0;
  for (size_t i = 0; i < owner.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::string b = good;
      b[data_start + i] = char(b[data_start + i] ^ (1 << bit));
      write_all(flipped, b);
      ++flips;
      try {
        load_safetensors(flipped);
      } catch (const Error& e) {
        const std::string msg = e.what();
        const bool named = msg.find(flipped) != std::string::npos &&
                           msg.find("tensor '" + owner[i] + "' is corrupt") != std::string::npos;
        if (!named) FAIL_CHECK("byte " << i << " bit " << bit << ": " << msg);
        detected += named;
      }
    }
  std::printf("safetensors checksums: %lld of %lld single-bit flips in %zu bytes of tensor data detected\n",
              (long long)detected, (long long)flips, owner.size());
  CHECK(flips == int64_t(owner.size()) * 8);
  CHECK(detected == flips);

  // Anywhere in the header, one flipped bit per byte: an error, or the very same tensors (a flip
  // in a metadata value or the padding may be harmless); never silently different data.
  int64_t header_errors = 0, harmless = 0;
  for (size_t i = 0; i < data_start; ++i) {
    std::string b = good;
    b[i] = char(b[i] ^ (1 << (i % 8)));
    write_all(flipped, b);
    try {
      NamedTensors loaded = load_safetensors(flipped);
      if (!same_tensors(loaded, tensors)) FAIL_CHECK("header byte " << i << ": silently different tensors");
      ++harmless;
    } catch (const Error&) {
      ++header_errors;
    }
  }
  std::printf("safetensors checksums: header flips: %lld bytes, %lld errors, %lld harmless, 0 silent\n",
              (long long)data_start, (long long)header_errors, (long long)harmless);
}

TEST_CASE("safetensors checksums: inconsistent checksum entries are refused", "[safetensors][checksum]") {
  ChecksumTempDir tmp;
  const std::string path = tmp.file("entries.safetensors");
  auto st_file = [&](const std::string& header, const std::string& data) {
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
    write_all(path, len + header + data);
    return path;
  };
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  const std::string sum = checksum_hex(checksum64(data.data(), 8));
  const std::string w = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})";
  const std::string md = R"("xxh3:__metadata__":")" + checksum_hex(checksum64("{}", 2)) + R"(",)";
  CHECK_THROWS_WITH(load_safetensors(st_file(R"({"__metadata__":{"xxh3:w":"12"},)" + w + "}", data)),
                    Contains(path) && Contains("checksum '12' is not 16 hex digits"));
  CHECK_THROWS_WITH(load_safetensors(st_file(R"({"__metadata__":{"xxh3:w":")" + sum + R"("},)" + w + "}", data)),
                    Contains(path) && Contains("has tensor checksums but no 'xxh3:__metadata__'"));
  CHECK_THROWS_WITH(
      load_safetensors(st_file(R"({"__metadata__":{)" + md + R"("xxh3:w":")" + sum + R"("},)" + w + "}", data)),
      Contains(path) && Contains("tensor 'v' has no checksum"));
  CHECK_THROWS_WITH(load_safetensors_metadata(st_file(
                        R"({"__metadata__":{"lr":"0.1",)" + md + R"("xxh3:w":")" + sum + R"("},)" + w + "}", data)),
                    Contains(path) && Contains("__metadata__ is corrupt"));
  const std::string all = R"("xxh3:w":")" + checksum_hex(checksum64(data.data(), 4)) + R"(","xxh3:v":")" +
                          checksum_hex(checksum64(data.data() + 4, 4)) + R"(")";
  CHECK_THROWS_WITH(load_safetensors(st_file(R"({"__metadata__":{)" + md + all + R"(,"xxh3:x":")" + sum + R"("},)" +
                                             w + "}", data)),
                    Contains("checksum for 'x', which is not a tensor"));
  CHECK(load_safetensors(st_file(R"({"__metadata__":{)" + md + all + R"(},)" + w + "}", data)).size() == 2);
  CHECK_THROWS_WITH(save_safetensors(tmp.file("r.safetensors"), {{"w", ones({1})}}, {{"xxh3:w", sum}}),
                    Contains("metadata key 'xxh3:w' is reserved"));
}

TEST_CASE("safetensors checksums: files from other tools (no checksums) still load", "[safetensors][checksum]") {
  // Written by PyTorch / safetensors (tests/gen_gpt2_fixture.py): no "xxh3:" entries.
  const std::string hf = std::string(MG_FIXTURE_DIR) + "/gpt2_hf_tiny.safetensors";
  REQUIRE(read_all(hf).find("xxh3:") == std::string::npos);
  NamedTensors t = load_safetensors(hf);
  CHECK(t.size() > 10);
  // And what memgrad writes carries one per tensor.
  ChecksumTempDir tmp;
  save_safetensors(tmp.file("ours.safetensors"), t);
  const std::string ours = read_all(tmp.file("ours.safetensors"));
  for (const auto& [name, _] : t) CHECK(ours.find("\"xxh3:" + name + "\"") != std::string::npos);
  CHECK(same_tensors(load_safetensors(tmp.file("ours.safetensors")), t));
}
