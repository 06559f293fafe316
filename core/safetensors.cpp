// safetensors reader and writer (format and guarantees in safetensors.h). The reader validates
// the whole header before it allocates a tensor (Note [safetensors validation]); the writer
// builds the header first, then streams each tensor's bytes into a temp file that is renamed over
// the target only once it is complete and on disk. Tensor bytes never pass through a std::vector:
// they go straight between the file and allocator memory (a staging tensor when a copy is needed).
#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/memory_category.h"

namespace mg {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data, which memgrad reads and writes as raw bytes");

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
// "__metadata__" key of a tensor's XXH3-64 checksum: "xxh3:<tensor name>" -> 16 hex digits, and
// "xxh3:__metadata__" for the rest of the metadata (its compact JSON with sorted keys), so a
// flipped hyperparameter in an optimizer file is caught too. No tensor is named "__metadata__".
constexpr const char* kChecksumPrefix = "xxh3:";
const std::string kMetadataChecksumKey = std::string(kChecksumPrefix) + "__metadata__";

uint64_t metadata_checksum(const std::map<std::string, std::string>& metadata) {
  const std::string text = nlohmann::json(metadata).dump();
  return checksum64(text.data(), text.size());
}

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32"}, {DType::f64, "F64"}, {DType::f16, "F16"},
                                     {DType::bf16, "BF16"}, {DType::i8, "I8"},  {DType::u8, "U8"},
                                     {DType::i32, "I32"},   {DType::i64, "I64"}, {DType::b8, "BOOL"}};
// Valid safetensors dtypes that memgrad has no element type for: reported as unsupported, not corrupt.
constexpr const char* kForeignDTypes[] = {"I16",     "U16",     "U32", "U64",     "F8_E4M3", "F8_E5M2",
                                          "F8_E8M0", "F4",      "F6_E2M3", "F6_E3M2", "C64"};

const char* safetensors_dtype_name(DType t) {
  for (const DTypeName& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  MG_INTERNAL_ASSERT(false, "dtype ", t, " has no safetensors name");
}

std::string supported_dtype_list() {
  std::string s;
  for (const DTypeName& d : kDTypeNames) s += std::string(s.empty() ? "" : " ") + d.name;
  return s;
}

// ---- reading ----------------------------------------------------------------------------------

// Note [safetensors validation]
// A file is accepted only if all of these hold (the reference implementation's rules, with one
// error message per rule): at least 8 bytes; a header length in (0, 100 MB] that fits in the
// file; a header that is JSON (no NUL bytes), an object, and names no key twice; "__metadata__",
// when present, an object of strings; every other entry an object with a known "dtype", a
// "shape" of non-negative integers and "data_offsets" [begin, end] with begin <= end, whose
// length is exactly numel x dtype size and which ends inside the data section; and the entries,
// sorted by offset, tile the data section exactly: no overlap, no gap, no trailing bytes.
// Only after all of that does the reader allocate and read, so a bad file costs no memory.

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;  // without the checksum entries
  std::map<std::string, uint64_t> checksums;     // tensor name -> XXH3-64; empty for foreign files
  uint64_t data_start = 0;  // file offset of the data section: 8 + header length
};

#define MG_ST_CHECK(cond, ...) MG_CHECK(cond, "safetensors: ", path, ": ", __VA_ARGS__)

DType parse_entry_dtype(const std::string& path, const std::string& name, const json& v) {
  MG_ST_CHECK(v.is_string(), "entry '", name, "': dtype ", v.dump(), " is not a string");
  const std::string& s = v.get_ref<const std::string&>();
  for (const DTypeName& d : kDTypeNames)
    if (s == d.name) return d.dtype;
  bool foreign = std::find(std::begin(kForeignDTypes), std::end(kForeignDTypes), s) != std::end(kForeignDTypes);
  MG_ST_CHECK(!foreign, "entry '", name, "': dtype ", s, " is not supported by memgrad (supported: ",
              supported_dtype_list(), ")");
  MG_THROW("safetensors: ", path, ": entry '", name, "': unknown dtype '", s, "' (expected one of ",
           supported_dtype_list(), ")");
}

Entry parse_entry(const std::string& path, const std::string& name, const json& v) {
  MG_ST_CHECK(v.is_object(), "entry '", name, "' is not an object (got ", v.type_name(), ")");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    MG_ST_CHECK(v.contains(field), "entry '", name, "' lacks \"", field, "\"");
  Entry e;
  e.name = name;
  e.dtype = parse_entry_dtype(path, name, v["dtype"]);

  const json& shape = v["shape"];
  bool shape_ok = shape.is_array();
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; shape_ok && i < shape.size(); ++i) {
    // Only non-negative integer literals parse as unsigned: -1, 2.0 and "2" are all rejected.
    shape_ok = shape[i].is_number_unsigned() &&
               shape[i].get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max());
    if (!shape_ok) break;
    uint64_t d = shape[i].get<uint64_t>();
    e.shape.push_back(int64_t(d));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  MG_ST_CHECK(shape_ok, "entry '", name, "': shape ", shape.dump(), " is not a list of non-negative integers");
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes) ||
             numel > uint64_t(std::numeric_limits<int64_t>::max());
  MG_ST_CHECK(!overflow, "entry '", name, "': shape ", shape.dump(), " has more bytes than 64 bits can count");

  const json& off = v["data_offsets"];
  MG_ST_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
              "entry '", name, "': data_offsets ", off.dump(), " is not two non-negative integers [begin, end]");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  MG_ST_CHECK(e.begin <= e.end, "entry '", name, "': data_offsets ", off.dump(), " has begin > end");
  MG_ST_CHECK(e.end - e.begin == nbytes, "entry '", name, "': data_offsets ", off.dump(), " hold ",
              e.end - e.begin, " bytes, but shape ", shape.dump(), " of ", safetensors_dtype_name(e.dtype),
              " needs ", nbytes, " (byte count != numel x dtype size)");
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& v) {
  MG_ST_CHECK(v.is_object(), "__metadata__ is not a string->string map (got ", v.type_name(), ")");
  std::map<std::string, std::string> m;
  for (const auto& [k, x] : v.items()) {
    MG_ST_CHECK(x.is_string(), "__metadata__ is not a string->string map: value of '", k, "' is ", x.dump());
    m[k] = x.get<std::string>();
  }
  return m;
}

// Moves the "xxh3:<tensor>" entries of the metadata into h.checksums and verifies the metadata's
// own (Note [Checksums] in core/checksum.h). A file has a checksum for the metadata and every
// tensor, or none at all (a file from another tool).
void split_checksums(const std::string& path, Header& h) {
  for (auto it = h.metadata.begin(); it != h.metadata.end();) {
    if (it->first.rfind(kChecksumPrefix, 0) != 0) {
      ++it;
      continue;
    }
    std::string name = it->first.substr(std::strlen(kChecksumPrefix));
    std::optional<uint64_t> v = parse_checksum_hex(it->second);
    MG_ST_CHECK(v.has_value(), "__metadata__ '", it->first, "': checksum '", it->second,
                "' is not 16 hex digits (corrupt header)");
    h.checksums[name] = *v;
    it = h.metadata.erase(it);
  }
  if (h.checksums.empty()) return;
  auto md = h.checksums.find("__metadata__");
  MG_ST_CHECK(md != h.checksums.end(), "__metadata__ has tensor checksums but no '", kMetadataChecksumKey,
              "' (corrupt header)");
  MG_ST_CHECK(md->second == metadata_checksum(h.metadata), "__metadata__ is corrupt: its entries hash to xxh3 ",
              checksum_hex(metadata_checksum(h.metadata)), ", the file recorded ", checksum_hex(md->second));
  h.checksums.erase(md);
  std::set<std::string> names;
  for (const Entry& e : h.entries) {
    names.insert(e.name);
    MG_ST_CHECK(h.checksums.count(e.name), "tensor '", e.name,
                "' has no checksum while the file's other tensors have one (corrupt header)");
  }
  for (const auto& [name, _] : h.checksums)
    MG_ST_CHECK(names.count(name), "__metadata__ has a checksum for '", name,
                "', which is not a tensor of the file (corrupt header)");
}

// Reads and validates the header (Note [safetensors validation]); leaves `f` anywhere.
Header read_header(std::ifstream& f, const std::string& path) {
  f.seekg(0, std::ios::end);
  const std::streamoff end = f.tellg();
  MG_ST_CHECK(end >= 0, "cannot determine the file's size");
  const uint64_t file_size = uint64_t(end);
  f.seekg(0);
  MG_ST_CHECK(file_size >= 8, "file is ", file_size,
              " bytes, shorter than the 8-byte header length (not a safetensors file)");
  unsigned char len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  MG_ST_CHECK(bool(f), "cannot read the header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len_bytes[i]) << (8 * i);  // little-endian u64
  MG_ST_CHECK(n > 0, "header length is 0 (the JSON header must hold at least \"{}\")");
  MG_ST_CHECK(n <= kMaxHeaderBytes, "header length ", n, " is larger than the 100 MB limit (corrupt length?)");
  MG_ST_CHECK(n <= file_size - 8, "header length ", n, " runs past the end of the file (", file_size, " bytes)");

  std::string text(n, '\0');
  f.read(text.data(), std::streamsize(n));
  MG_ST_CHECK(bool(f), "cannot read the ", n, "-byte header");
  // nlohmann stops at a NUL as if the input ended there, so "{}\0garbage" would pass without this.
  MG_ST_CHECK(text.find('\0') == std::string::npos, "header is not valid JSON: it contains a NUL byte");
  std::set<std::string> keys;
  std::optional<std::string> duplicate;
  json j;
  try {
    // nlohmann keeps the last of two equal keys; the callback sees every top-level key.
    j = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key && !keys.insert(parsed.get<std::string>()).second &&
          !duplicate)
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& e) {
    MG_THROW("safetensors: ", path, ": header is not valid JSON (", e.what(), ")");
  }
  MG_ST_CHECK(j.is_object(), "header is not a JSON object (got ", j.type_name(), ")");
  MG_ST_CHECK(!duplicate, "header has two entries named '", duplicate.value_or(""), "'");

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      h.metadata = parse_metadata(path, v);
      continue;
    }
    Entry e = parse_entry(path, name, v);
    MG_ST_CHECK(e.end <= data_size, "entry '", name, "': data_offsets end ", e.end,
                " is past the end of the data section (", data_size, " bytes): truncated file or bad offsets");
    h.entries.push_back(std::move(e));
  }
  split_checksums(path, h);
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The entries must tile [0, data_size): each starts where the previous one ended.
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    MG_ST_CHECK(e.begin >= covered, "entries '", prev ? prev->name : "", "' [", prev ? prev->begin : 0, ", ",
                covered, ") and '", e.name, "' [", e.begin, ", ", e.end, ") overlap");
    MG_ST_CHECK(e.begin == covered, "gap of ", e.begin - covered, " bytes before entry '", e.name,
                "' at data offset ", e.begin, " (tensors must be packed back to back)");
    covered = e.end;
    prev = &e;
  }
  MG_ST_CHECK(covered == data_size, data_size - covered, " trailing bytes after the last tensor (the data section is ",
              data_size, " bytes, the tensors cover ", covered, ")");
  return h;
}

std::ifstream open_for_reading(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MG_ST_CHECK(f.is_open(), "cannot open the file: ", std::strerror(errno));
  MG_ST_CHECK(!std::filesystem::is_directory(path), "is a directory, not a safetensors file");
  return f;
}

// ---- writing ----------------------------------------------------------------------------------

// The file being written: `target + ".tmp.<pid>"`, removed on destruction unless committed.
class TempFile {
 public:
  explicit TempFile(const std::string& target)
      : target_(target), path_(target + ".tmp." + std::to_string(::getpid())) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    check(fd_ >= 0, "cannot create the temp file ", path_);
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write_all(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t k = fault_now(FaultSite::file_write) ? (errno = EIO, -1) : ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      check(k > 0, "cannot write ", path_);
      p += k;
      n -= size_t(k);
    }
  }

  // Overwrites n bytes at `offset` (the header, once the checksums are known).
  void rewrite_at(uint64_t offset, const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t k = fault_now(FaultSite::file_write) ? (errno = EIO, -1) : ::pwrite(fd_, p, n, off_t(offset));
      if (k < 0 && errno == EINTR) continue;
      check(k > 0, "cannot write ", path_);
      p += k;
      offset += uint64_t(k);
      n -= size_t(k);
    }
  }

  // Makes the bytes durable, then atomically replaces the target with them.
  void commit() {
    check(!fault_now(FaultSite::file_write) ? ::fsync(fd_) == 0 : (errno = EIO, false), "cannot fsync ", path_);
    int fd = fd_;
    fd_ = -1;
    check(::close(fd) == 0, "cannot close ", path_);
    check(::rename(path_.c_str(), target_.c_str()) == 0, "cannot rename ", path_, " over it");
    committed_ = true;
    // Make the rename itself durable. The new file is already in place, so a failure here is not
    // reported as a failed save (the data is written; only its survival of a power cut is at stake).
    std::filesystem::path dir = std::filesystem::path(target_).parent_path();
    int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  template <typename... Args>
  void check(bool ok, const Args&... what) const {
    if (!ok) MG_THROW("save_safetensors: ", target_, ": ", what..., ": ", std::strerror(errno));
  }

  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes t's elements in row-major order. A contiguous host tensor goes straight from its memory;
// anything else through a host staging tensor (workspace memory, freed right after).
// Returns the XXH3-64 of the bytes written.
uint64_t write_tensor_bytes(TempFile& out, const Tensor& t) {
  if (t.nbytes() == 0) return checksum64(nullptr, 0);
  if (t.device().is_cpu() && t.is_contiguous()) {
    out.write_all(t.data_ptr(), t.nbytes());
    return checksum64(t.data_ptr(), t.nbytes());
  }
  MemoryCategoryGuard category(MemoryCategory::workspace);
  Tensor host = empty(t.shape(), {.dtype = t.dtype(), .device = kCPU});
  if (t.device().is_cpu() || t.is_contiguous()) {
    copy_to_contiguous_bytes(t, host.data_ptr());
  } else {
    // A strided view on a device: bring the storage span it covers to the host, then gather there.
    int64_t last = t.storage_offset();  // strides are non-negative (as_strided checks)
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    int64_t span = last - t.storage_offset() + 1;
    Tensor span_host = empty({span}, {.dtype = t.dtype(), .device = kCPU});
    const char* src = static_cast<const char*>(t.storage()->data()) + t.storage_offset() * int64_t(t.element_size());
    copy_bytes(span_host.data_ptr(), kCPU, src, t.device(), size_t(span) * t.element_size());
    copy_to_contiguous_bytes(span_host.as_strided(t.shape(), t.strides(), 0), host.data_ptr());
  }
  out.write_all(host.data_ptr(), host.nbytes());
  return checksum64(host.data_ptr(), host.nbytes());
}

// The header text for `tensors` (with the data offsets and the checksums `sums`, in order),
// padded with spaces to a multiple of 8 bytes.
std::string header_text(const std::string& path, const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata, const std::vector<uint64_t>& sums) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json md = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) md[k] = v;
  if (!metadata.empty() || !tensors.empty()) md[kMetadataChecksumKey] = checksum_hex(metadata_checksum(metadata));
  for (size_t i = 0; i < tensors.size(); ++i) md[kChecksumPrefix + tensors[i].first] = checksum_hex(sums[i]);
  if (!md.empty()) header["__metadata__"] = std::move(md);
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    entry["shape"] = nlohmann::ordered_json::array();
    for (int64_t d : t.shape()) entry["shape"].push_back(d);
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + t.nbytes()});
    offset += t.nbytes();
    header[name] = std::move(entry);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MG_THROW("save_safetensors: ", path, ": cannot encode the header (names and metadata must be UTF-8): ",
             e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  return text;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Everything that can be checked is checked before the temp file exists.
  for (const auto& [k, _] : metadata)
    MG_CHECK(k.rfind(kChecksumPrefix, 0) != 0, "save_safetensors: ", path, ": metadata key '", k,
             "' is reserved (memgrad stores each tensor's checksum under \"", kChecksumPrefix, "<name>\")");
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    MG_CHECK(name != "__metadata__", "save_safetensors: ", path, ": '__metadata__' is reserved, not a tensor name");
    MG_CHECK(names.insert(name).second, "save_safetensors: ", path, ": duplicate tensor name '", name, "'");
    MG_CHECK(t.defined(), "save_safetensors: ", path, ": tensor '", name, "' is undefined");
    MG_CHECK(!t.is_meta(), "save_safetensors: ", path, ": tensor '", name,
             "' is on meta, which holds no data (move it to a real device first)");
  }
  // The header goes first with placeholder checksums (16 zeros: the same length as the real
  // ones), the data follows in one pass that hashes it, and the header is rewritten in place.
  std::vector<uint64_t> sums(tensors.size(), 0);
  const std::string text = header_text(path, tensors, metadata, sums);

  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  TempFile out(path);
  out.write_all(len_bytes, 8);
  out.write_all(text.data(), text.size());
  for (size_t i = 0; i < tensors.size(); ++i) sums[i] = write_tensor_bytes(out, tensors[i].second);
  if (!tensors.empty()) {
    const std::string final_text = header_text(path, tensors, metadata, sums);
    MG_INTERNAL_ASSERT(final_text.size() == text.size(), "safetensors header changed length with its checksums");
    out.rewrite_at(8, final_text.data(), final_text.size());
  }
  out.commit();
}

namespace {
void verify_checksum(const std::string& path, const Header& h, const Entry& e, const void* data, size_t n) {
  auto it = h.checksums.find(e.name);
  if (it == h.checksums.end()) return;  // a file without checksums (split_checksums: all or none)
  const uint64_t actual = checksum64(data, n);
  MG_ST_CHECK(actual == it->second, "tensor '", e.name, "' is corrupt: its ", n, " bytes hash to xxh3 ",
              checksum_hex(actual), ", the file recorded ", checksum_hex(it->second),
              "\n  hint: the file was damaged after it was written (disk, copy, edit); restore it or "
              "use an earlier checkpoint");
}
}  // namespace

NamedTensors load_safetensors(const std::string& path, Device device) {
  std::ifstream f = open_for_reading(path);
  Header h = read_header(f, path);
  NamedTensors out;
  out.reserve(h.entries.size());
  for (const Entry& e : h.entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype, .device = device});
    const size_t n = size_t(e.end - e.begin);
    if (!device.is_meta() && n > 0) {
      f.seekg(std::streamoff(h.data_start + e.begin));
      Tensor host = t;
      std::optional<MemoryCategoryGuard> category;
      if (!device.is_cpu()) {  // read into host memory, then copy to the device
        category.emplace(MemoryCategory::workspace);
        host = empty(e.shape, {.dtype = e.dtype, .device = kCPU});
      }
      f.read(static_cast<char*>(host.data_ptr()), std::streamsize(n));
      // The size was validated, so a short read means the file shrank while we read it.
      MG_ST_CHECK(bool(f), "truncated data section: cannot read the ", n, " bytes of entry '", e.name, "'");
      verify_checksum(path, h, e, host.data_ptr(), n);
      if (!host.is_same(t)) copy_bytes(t.data_ptr(), device, host.data_ptr(), kCPU, n);
    }
    if (!device.is_meta() && n == 0) verify_checksum(path, h, e, nullptr, 0);
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  std::ifstream f = open_for_reading(path);
  return read_header(f, path).metadata;
}

#undef MG_ST_CHECK

}  // namespace mg
