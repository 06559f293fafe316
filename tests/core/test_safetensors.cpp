// safetensors I/O: bit-exact round trips for every dtype and for strided, 0-d and empty tensors;
// metadata; byte layouts written by hand (so the format matches Hugging Face's, not only itself);
// atomic saves; and one test per kind of corrupt file, each checking the error names the file
// and the problem.
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/safetensors.h"
#include "core/tensor.h"

using namespace mg;
namespace fs = std::filesystem;

namespace {

// A fresh folder under /tmp for one test, removed with everything in it at the end.
struct TempDir {
  fs::path dir;
  TempDir() {
    static int counter = 0;
    dir = fs::path("/tmp") / ("mg_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  // Names of leftover temp files (".tmp.<pid>") in the folder.
  std::vector<std::string> temp_files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
    return out;
  }
};

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xff);
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A file made of a header length, a header and data, as a writer other than memgrad would.
std::string st_bytes(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

std::vector<unsigned char> bytes_of(const Tensor& t) {
  std::vector<unsigned char> b(t.nbytes());
  copy_to_contiguous_bytes(t, b.data());
  return b;
}

// A tensor of random bit patterns (NaNs and subnormals included); bool gets 0 or 1.
Tensor random_bits(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = empty(shape, {.dtype = dtype});
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = dtype == DType::b8 ? rng() % 2 : rng() % 256;
  return t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected an mg::Error");
  return "";
}

// Loads a corrupt file: both readers must fail, naming the file and containing `phrase`.
void check_corrupt(const std::string& bytes, const std::string& phrase) {
  TempDir tmp;
  std::string path = tmp.file("corrupt.safetensors");
  write_file(path, bytes);
  std::string msg = error_of([&] { load_safetensors(path); });
  INFO(msg);
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find(phrase) != std::string::npos);
  CHECK(error_of([&] { load_safetensors_metadata(path); }) == msg);
}

// One valid f32 entry of `n` elements at [0, 4n), for headers that break one other rule.
const std::string kOneF32 = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

}  // namespace

TEST_CASE("safetensors: every dtype round-trips bit-exactly", "[safetensors]") {
  TempDir tmp;
  std::mt19937 rng(1234);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dt : kAllDTypes) tensors.emplace_back(std::string(dtype_name(dt)), random_bits({3, 5}, dt, rng));
  std::string path = tmp.file("all.safetensors");
  save_safetensors(path, tensors);

  auto loaded = load_safetensors(path);
  REQUIRE(loaded.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO(tensors[i].first);
    CHECK(loaded[i].first == tensors[i].first);  // saved order is the data order
    CHECK(loaded[i].second.dtype() == tensors[i].second.dtype());
    CHECK(loaded[i].second.shape() == Shape{3, 5});
    CHECK(loaded[i].second.device() == kCPU);
    CHECK(bytes_of(loaded[i].second) == bytes_of(tensors[i].second));
  }
  CHECK(tmp.temp_files().empty());
}

TEST_CASE("safetensors: known f16, bf16 and bool values survive", "[safetensors]") {
  TempDir tmp;
  // 65504 (f16 max), 2^-24 (smallest f16 subnormal), -0; bf16 keeps 8 bits of mantissa.
  Tensor h = from_vector(std::vector<double>{65504.0, 5.9604644775390625e-8, -0.0, 1.5}, {4}, {.dtype = DType::f16});
  Tensor b = from_vector(std::vector<double>{3.140625, -1e30, 0.5}, {3}, {.dtype = DType::bf16});
  Tensor m = from_vector(std::vector<double>{1, 0, 0, 1, 1}, {5}, {.dtype = DType::b8});
  std::string path = tmp.file("half.safetensors");
  save_safetensors(path, {{"h", h}, {"b", b}, {"m", m}});
  auto loaded = load_safetensors(path);
  CHECK(loaded[0].second.to_vector<double>() == h.to_vector<double>());
  CHECK(bytes_of(loaded[0].second) == bytes_of(h));
  CHECK(bytes_of(loaded[1].second) == bytes_of(b));
  CHECK(loaded[2].second.to_vector<int>() == std::vector<int>{1, 0, 0, 1, 1});
}

TEST_CASE("safetensors: a non-contiguous view is written in logical order", "[safetensors]") {
  TempDir tmp;
  Tensor base = arange(0, 12, 1, {.dtype = DType::f32}).as_strided({3, 4}, {4, 1}, 0);
  Tensor transposed = base.as_strided({4, 3}, {1, 4}, 0);  // (4, 3) = base^T
  Tensor window = base.as_strided({2, 2}, {4, 1}, 5);      // rows 1-2, columns 1-2
  REQUIRE_FALSE(transposed.is_contiguous());
  std::string path = tmp.file("views.safetensors");
  save_safetensors(path, {{"t", transposed}, {"w", window}});
  auto loaded = load_safetensors(path);
  CHECK(loaded[0].second.shape() == Shape{4, 3});
  CHECK(loaded[0].second.is_contiguous());
  CHECK(loaded[0].second.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK(loaded[1].second.to_vector<float>() == std::vector<float>{5, 6, 9, 10});
}

TEST_CASE("safetensors: 0-d and empty tensors", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("shapes.safetensors");
  Tensor s = scalar_tensor(-2.5, {.dtype = DType::f64});
  Tensor e0 = empty({0}, {.dtype = DType::f32});
  Tensor e1 = empty({2, 0, 3}, {.dtype = DType::i64});
  save_safetensors(path, {{"empty0", e0}, {"scalar", s}, {"empty1", e1}});
  std::string raw = read_file(path);
  CHECK(raw.find(R"("scalar":{"dtype":"F64","shape":[],"data_offsets":[0,8]})") != std::string::npos);
  CHECK(raw.find(R"("empty1":{"dtype":"I64","shape":[2,0,3],"data_offsets":[8,8]})") != std::string::npos);

  auto loaded = load_safetensors(path);
  REQUIRE(loaded.size() == 3);
  // Sorted by offset: empty0 [0,0), scalar [0,8), empty1 [8,8).
  CHECK(loaded[0].first == "empty0");
  CHECK(loaded[0].second.shape() == Shape{0});
  CHECK(loaded[1].first == "scalar");
  CHECK(loaded[1].second.dim() == 0);
  CHECK(loaded[1].second.item() == -2.5);
  CHECK(loaded[2].second.shape() == Shape{2, 0, 3});
  CHECK(loaded[2].second.dtype() == DType::i64);

  SECTION("a file with no tensors at all") {
    save_safetensors(path, {});
    CHECK(read_file(path) == le64(8) + "{}      ");
    CHECK(load_safetensors(path).empty());
  }
}

TEST_CASE("safetensors: metadata round-trips and is omitted when there is none", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("meta.safetensors");
  std::map<std::string, std::string> md = {{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode \"quoted\""},
                                           {"empty", ""}};
  save_safetensors(path, {{"x", ones({2})}}, md);
  CHECK(load_safetensors_metadata(path) == md);
  CHECK(load_safetensors(path).size() == 1);  // __metadata__ is not a tensor

  save_safetensors(path, {{"x", ones({2})}});
  CHECK(load_safetensors_metadata(path).empty());  // the checksum entries are not user metadata
  save_safetensors(path, {});
  CHECK(read_file(path).find("__metadata__") == std::string::npos);
}

TEST_CASE("safetensors: the writer produces the reference byte layout", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("layout.safetensors");
  save_safetensors(path, {{"w", from_vector(std::vector<float>{1.0f, -2.0f}, {2}, {})}}, {{"format", "pt"}});
  // What huggingface/safetensors writes: compact JSON, __metadata__ first, padded with spaces to
  // a multiple of 8, then little-endian data (1.0f = 00 00 80 3f, -2.0f = 00 00 00 c0); memgrad
  // adds each tensor's XXH3-64 to the metadata (core/checksum.h).
  std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  const std::string md_json = R"({"format":"pt"})";
  std::string header = R"({"__metadata__":{"format":"pt","xxh3:__metadata__":")" +
                       checksum_hex(checksum64(md_json.data(), md_json.size())) + R"(","xxh3:w":")" +
                       checksum_hex(checksum64(data.data(), 8)) +
                       R"("},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  CHECK(read_file(path) == st_bytes(header, data));
}

TEST_CASE("safetensors: loads a file laid out by hand", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("hand.safetensors");
  // JSON order differs from data order; no padding (allowed: the reader must not require it).
  std::string header =
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},)"
      R"("a":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("h":{"dtype":"F16","shape":[1],"data_offsets":[20,22]},"__metadata__":{"k":"v"}})";
  std::string data = std::string("\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\xff\xff\xff\xff", 16) +
                     std::string("\x80\x3f\x20\xc0", 4) +  // bf16 1.0 (0x3f80), -2.5 (0xc020)
                     std::string("\x00\x3c", 2);           // f16 1.0 (0x3c00)
  write_file(path, st_bytes(header, data));
  auto loaded = load_safetensors(path);
  REQUIRE(loaded.size() == 3);
  CHECK(loaded[0].first == "a");
  CHECK(loaded[0].second.dtype() == DType::i32);
  CHECK(loaded[0].second.shape() == Shape{2, 2});
  CHECK(loaded[0].second.to_vector<int>() == std::vector<int>{1, 2, 3, -1});
  CHECK(loaded[1].first == "b");
  CHECK(loaded[1].second.to_vector<float>() == std::vector<float>{1.0f, -2.5f});
  CHECK(loaded[2].first == "h");
  CHECK(loaded[2].second.to_vector<float>() == std::vector<float>{1.0f});
  CHECK(load_safetensors_metadata(path) == std::map<std::string, std::string>{{"k", "v"}});
}

TEST_CASE("safetensors: loads onto another cpu device and onto meta", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("dev.safetensors");
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, {});
  save_safetensors(path, {{"x", x}});
  auto on1 = load_safetensors(path, Device("cpu:1"));
  CHECK(on1[0].second.device() == Device("cpu:1"));
  CHECK(on1[0].second.to_vector<float>() == x.to_vector<float>());
  auto on_meta = load_safetensors(path, kMeta);
  CHECK(on_meta[0].second.is_meta());
  CHECK(on_meta[0].second.shape() == Shape{2, 3});
  CHECK(on_meta[0].second.dtype() == DType::f32);
}

// ---- saving: errors and atomicity ----------------------------------------------------------------

TEST_CASE("safetensors: bad tensors are refused before anything is written", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("old.safetensors");
  save_safetensors(path, {{"old", ones({3})}});
  const std::string before = read_file(path);

  std::string msg = error_of([&] { save_safetensors(path, {{"a", ones({2})}, {"m", empty({2}, {.device = kMeta})}}); });
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("tensor 'm' is on meta") != std::string::npos);
  msg = error_of([&] { save_safetensors(path, {{"a", ones({2})}, {"a", ones({2})}}); });
  CHECK(msg.find("duplicate tensor name 'a'") != std::string::npos);
  msg = error_of([&] { save_safetensors(path, {{"__metadata__", ones({2})}}); });
  CHECK(msg.find("reserved") != std::string::npos);
  msg = error_of([&] { save_safetensors(path, {{"u", Tensor()}}); });
  CHECK(msg.find("tensor 'u' is undefined") != std::string::npos);

  CHECK(read_file(path) == before);
  CHECK(tmp.temp_files().empty());
}

TEST_CASE("safetensors: a save that fails while writing leaves the old file intact", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("old.safetensors");
  save_safetensors(path, {{"old", ones({3})}});
  const std::string before = read_file(path);

  SECTION("the disk fills up mid-write") {
    // A file-size limit makes write() fail with EFBIG after 4 KiB, as a full disk would.
    struct rlimit saved;
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string msg;
    try {
      save_safetensors(path, {{"big", zeros({1 << 16})}});
    } catch (const Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("cannot write") != std::string::npos);
  }
  SECTION("the final rename fails") {
    std::string dir_path = tmp.file("is_a_dir");
    fs::create_directories(fs::path(dir_path) / "child");
    std::string msg = error_of([&] { save_safetensors(dir_path, {{"x", ones({2})}}); });
    CHECK(msg.find(dir_path) != std::string::npos);
    CHECK(msg.find("cannot rename") != std::string::npos);
    CHECK(fs::is_directory(fs::path(dir_path) / "child"));
  }
  SECTION("the temp file cannot be created") {
    std::string missing = tmp.file("no_such_dir/x.safetensors");
    std::string msg = error_of([&] { save_safetensors(missing, {{"x", ones({2})}}); });
    CHECK(msg.find(missing) != std::string::npos);
    CHECK(msg.find("cannot create the temp file") != std::string::npos);
  }
  CHECK(read_file(path) == before);
  CHECK(tmp.temp_files().empty());
}

TEST_CASE("safetensors: a successful save replaces the old file", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("model.safetensors");
  save_safetensors(path, {{"old", ones({3})}});
  save_safetensors(path, {{"new", full({2}, 7.0)}});
  auto loaded = load_safetensors(path);
  REQUIRE(loaded.size() == 1);
  CHECK(loaded[0].first == "new");
  CHECK(loaded[0].second.to_vector<float>() == std::vector<float>{7, 7});
  CHECK(tmp.temp_files().empty());
}

// ---- loading corrupt files: one test per rule of Note [safetensors validation] --------------------

TEST_CASE("safetensors corrupt: missing file", "[safetensors]") {
  std::string path = "/tmp/mg_safetensors_no_such_file_" + std::to_string(::getpid());
  std::string msg = error_of([&] { load_safetensors(path); });
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find("cannot open") != std::string::npos);
  TempDir tmp;
  msg = error_of([&] { load_safetensors(tmp.dir.string()); });
  CHECK(msg.find(tmp.dir.string()) != std::string::npos);
  CHECK(msg.find("is a directory") != std::string::npos);
}

TEST_CASE("safetensors corrupt: file shorter than 8 bytes", "[safetensors]") {
  check_corrupt("\x05\x00\x00", "shorter than the 8-byte header length");
  check_corrupt("", "shorter than the 8-byte header length");
}

TEST_CASE("safetensors corrupt: header length 0", "[safetensors]") {
  check_corrupt(le64(0) + "{}", "header length is 0");
}

TEST_CASE("safetensors corrupt: header length over 100 MB", "[safetensors]") {
  check_corrupt(le64(100'000'001) + "{}", "larger than the 100 MB limit");
  check_corrupt(le64(~uint64_t(0)) + "{}", "larger than the 100 MB limit");
}

TEST_CASE("safetensors corrupt: header length past the end of the file", "[safetensors]") {
  check_corrupt(le64(1000) + kOneF32, "runs past the end of the file");
}

TEST_CASE("safetensors corrupt: header is not valid JSON", "[safetensors]") {
  check_corrupt(st_bytes(R"({"w": {"dtype": )", ""), "header is not valid JSON");
  check_corrupt(st_bytes(std::string("{}\0\0\0\0\0\0", 8), ""), "NUL byte");
  check_corrupt(st_bytes("{\"\xff\":1}", ""), "header is not valid JSON");  // not UTF-8
}

TEST_CASE("safetensors corrupt: header is not an object", "[safetensors]") {
  check_corrupt(st_bytes("[1, 2]  ", ""), "header is not a JSON object");
  check_corrupt(st_bytes("\"abc\"   ", ""), "header is not a JSON object");
}

TEST_CASE("safetensors corrupt: a name appears twice", "[safetensors]") {
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         std::string(8, '\0')),
                "two entries named 'w'");
}

TEST_CASE("safetensors corrupt: entry is not an object", "[safetensors]") {
  check_corrupt(st_bytes(R"({"w": [0, 8]})", ""), "entry 'w' is not an object");
}

TEST_CASE("safetensors corrupt: entry lacks dtype, shape or data_offsets", "[safetensors]") {
  std::string data(8, '\0');
  check_corrupt(st_bytes(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data), "entry 'w' lacks \"dtype\"");
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data), "entry 'w' lacks \"shape\"");
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", data), "entry 'w' lacks \"data_offsets\"");
}

TEST_CASE("safetensors corrupt: unknown dtype", "[safetensors]") {
  std::string data(8, '\0');
  check_corrupt(st_bytes(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype 'F33'");
  check_corrupt(st_bytes(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", data), "unknown dtype 'f32'");
  check_corrupt(st_bytes(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", data), "dtype 4 is not a string");
  // A real safetensors dtype that memgrad has no type for.
  check_corrupt(st_bytes(R"({"w":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", data),
                "dtype I16 is not supported by memgrad");
}

TEST_CASE("safetensors corrupt: shape is not a list of non-negative integers", "[safetensors]") {
  for (const char* shape : {"[-2]", "[2.0]", "[\"2\"]", "2", "[[2]]", "null", "[9223372036854775808]"}) {
    INFO(shape);
    check_corrupt(st_bytes(std::string(R"({"w":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,8]}})",
                           std::string(8, '\0')),
                  "is not a list of non-negative integers");
  }
  // Non-negative, but numel x size overflows.
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                         std::string(8, '\0')),
                "more bytes than 64 bits can count");
}

TEST_CASE("safetensors corrupt: data_offsets are not two ordered integers", "[safetensors]") {
  for (const char* off : {"[0]", "[0,8,16]", "[0,-8]", "[0,8.0]", "\"0,8\"", "{}"}) {
    INFO(off);
    check_corrupt(st_bytes(std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":)") + off + "}}",
                           std::string(8, '\0')),
                  "is not two non-negative integers [begin, end]");
  }
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, '\0')),
                "has begin > end");
}

TEST_CASE("safetensors corrupt: entry ends past the data section", "[safetensors]") {
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[100,108]}})", std::string(8, '\0')),
                "past the end of the data section (8 bytes)");
}

TEST_CASE("safetensors corrupt: byte count differs from numel x dtype size", "[safetensors]") {
  check_corrupt(st_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
                "byte count != numel x dtype size");
  check_corrupt(st_bytes(R"({"w":{"dtype":"F64","shape":[],"data_offsets":[0,4]}})", std::string(4, '\0')),
                "byte count != numel x dtype size");
}

TEST_CASE("safetensors corrupt: two entries overlap", "[safetensors]") {
  check_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, '\0')),
                "entries 'a' [0, 8) and 'b' [4, 12) overlap");
  // An empty entry inside another one's bytes overlaps it too (the reference rejects it).
  check_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                         std::string(8, '\0')),
                "overlap");
}

TEST_CASE("safetensors corrupt: gap between entries or trailing bytes", "[safetensors]") {
  check_corrupt(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                         std::string(12, '\0')),
                "gap of 4 bytes before entry 'b'");
  check_corrupt(st_bytes(kOneF32, std::string(11, '\0')), "3 trailing bytes after the last tensor");
}

TEST_CASE("safetensors corrupt: __metadata__ is not a string->string map", "[safetensors]") {
  std::string data(8, '\0');
  for (const char* md : {R"({"step": 3})", R"({"a": {"b": "c"}})", R"(["a"])", R"("format=pt")", "null"}) {
    INFO(md);
    std::string header = std::string(R"({"__metadata__":)") + md + "," + kOneF32.substr(1);
    check_corrupt(st_bytes(header, data), "__metadata__ is not a string->string map");
  }
}

TEST_CASE("safetensors corrupt: truncated data section", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("good.safetensors");
  save_safetensors(path, {{"a", ones({4})}, {"b", ones({4})}});
  std::string bytes = read_file(path);
  check_corrupt(bytes.substr(0, bytes.size() - 3), "truncated");
  check_corrupt(bytes.substr(0, bytes.size() - 3), "entry 'b': data_offsets end 32 is past the end of the data section");
}
