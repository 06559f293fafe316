// Token files (see token_file.h): the streaming writer, the validated read-only mapping, and
// tokenize_files, which turns a folder of text (e.g. /usr/share/games/fortunes) into a corpus.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

constexpr size_t kChunkTokens = 1 << 14;  // tokens per write (a 64 KiB buffer at most)

}  // namespace

// ---- writer ---------------------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(std::string path, int width) : path_(std::move(path)), width_(width) {
  MG_CHECK(width == 1 || width == 2 || width == 4, "write_token_file: '", path_, "': token width must be 1, 2 or 4 bytes, got ", width);
  tmp_path_ = temp_path_for(path_);
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  MG_CHECK(file_ != nullptr, "write_token_file: cannot create '", tmp_path_, "': ", std::strerror(errno));
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, 8);
  put_le(header + 8, kTokenFileVersion, 4);
  put_le(header + 12, uint64_t(width_), 4);
  put_le(header + 16, 0, 8);  // the count, patched by finish()
  MG_CHECK(std::fwrite(header, 1, sizeof(header), file_) == sizeof(header), "write_token_file: writing '", tmp_path_,
           "' failed: ", std::strerror(errno));
}

TokenFileWriter::~TokenFileWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void TokenFileWriter::write_raw(const void* data, size_t n) {
  MG_CHECK(file_ != nullptr, "write_token_file: '", path_, "' was already finished");
  checksum_.update(data, n);  // token bytes only: the header is written by the constructor
  MG_CHECK(std::fwrite(data, 1, n, file_) == n, "write_token_file: writing '", tmp_path_, "' failed: ", std::strerror(errno));
}

void TokenFileWriter::append(std::span<const uint32_t> tokens) {
  const uint64_t limit = width_ == 4 ? (uint64_t(1) << 32) : (uint64_t(1) << (8 * width_));
  unsigned char buf[kChunkTokens * 4];
  for (size_t start = 0; start < tokens.size(); start += kChunkTokens) {
    size_t n = std::min(kChunkTokens, tokens.size() - start);
    for (size_t i = 0; i < n; ++i) {
      uint32_t t = tokens[start + i];
      MG_CHECK(t < limit, "write_token_file: '", path_, "': token ", t, " at position ", count_ + int64_t(start + i),
               " does not fit in ", width_, " byte(s)");
      put_le(buf + i * size_t(width_), t, width_);
    }
    write_raw(buf, n * size_t(width_));
  }
  count_ += int64_t(tokens.size());
}

void TokenFileWriter::append_bytes(std::string_view bytes) {
  if (width_ == 1) {  // the bytes are the tokens
    write_raw(bytes.data(), bytes.size());
    count_ += int64_t(bytes.size());
    return;
  }
  uint32_t buf[kChunkTokens];
  for (size_t start = 0; start < bytes.size(); start += kChunkTokens) {
    size_t n = std::min(kChunkTokens, bytes.size() - start);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<unsigned char>(bytes[start + i]);
    append({buf, n});
  }
}

void TokenFileWriter::finish() {
  unsigned char count[8], trailer[kTokenFileTrailerBytes];
  put_le(count, uint64_t(count_), 8);
  put_le(trailer, checksum_.digest(), 8);
  MG_CHECK(file_ != nullptr, "write_token_file: '", path_, "' was already finished");
  bool ok = std::fwrite(trailer, 1, sizeof(trailer), file_) == sizeof(trailer) && std::fseek(file_, 16, SEEK_SET) == 0 && std::fwrite(count, 1, 8, file_) == 8 && std::fflush(file_) == 0 &&
            ::fsync(::fileno(file_)) == 0;
  int err = errno;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok) {
    std::remove(tmp_path_.c_str());
    MG_THROW("write_token_file: writing '", tmp_path_, "' failed: ", std::strerror(err));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(tmp_path_.c_str());
    MG_THROW("write_token_file: cannot rename '", tmp_path_, "' to '", path_, "': ", std::strerror(err));
  }
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens, int width) {
  TokenFileWriter w(path, width);
  w.append(tokens);
  w.finish();
}

// ---- reader ---------------------------------------------------------------------------------

TokenFile::TokenFile(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  MG_CHECK(fd >= 0, "TokenFile: cannot open '", path_, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MG_THROW("TokenFile: '", path_, "' is not a regular file");
  }
  auto file_bytes = int64_t(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    MG_THROW("TokenFile: '", path_, "' is too short for a token file: ", file_bytes, " bytes, the header alone is ",
             kTokenFileHeaderBytes, file_bytes == 0 ? " (the file is empty)" : "");
  }
  void* p = ::mmap(nullptr, size_t(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  if (p == MAP_FAILED) ::close(fd);
  MG_CHECK(p != MAP_FAILED, "TokenFile: cannot map '", path_, "': ", std::strerror(err));
  map_ = static_cast<const unsigned char*>(p);
  map_bytes_ = size_t(file_bytes);
  // Windows are read at random places: no read-ahead of neighbouring pages.
  ::madvise(p, map_bytes_, MADV_RANDOM);

  // Validate before anyone reads a token; unmap on failure (the destructor will not run).
  auto fail = [&](const std::string& why) {
    ::close(fd);
    ::munmap(p, map_bytes_);
    map_ = nullptr;
    MG_THROW("TokenFile: '", path_, "' ", why);
  };
  if (std::memcmp(map_, kTokenFileMagic, 8) != 0)
    fail("has a bad magic number (not a memgrad token file: expected it to start with \"MGTOKENS\")");
  auto version = uint32_t(get_le(map_ + 8, 4));
  if (version != 1 && version != 2)
    fail("has version " + std::to_string(version) + ", this memgrad reads versions 1 and 2");
  const int64_t trailer = version >= 2 ? kTokenFileTrailerBytes : 0;
  width_ = int(get_le(map_ + 12, 4));
  if (width_ != 1 && width_ != 2 && width_ != 4)
    fail("has token width " + std::to_string(width_) + " bytes; a token file's width is 1, 2 or 4");
  uint64_t count = get_le(map_ + 16, 8);
  if (count > uint64_t((INT64_MAX - kTokenFileHeaderBytes - trailer) / 4)) fail("has an impossible token count " + std::to_string(count));
  count_ = int64_t(count);
  int64_t expected = kTokenFileHeaderBytes + count_ * width_ + trailer;
  if (file_bytes < expected)
    fail("is truncated: the header says " + std::to_string(count_) + " tokens of " + std::to_string(width_) +
         " byte(s), so the file should have " + std::to_string(expected) + " bytes, but it has " +
         std::to_string(file_bytes));
  if (file_bytes > expected)
    fail("has " + std::to_string(file_bytes - expected) + " trailing bytes: expected " + std::to_string(expected) +
         " bytes (header + " + std::to_string(count_) + " tokens" + (trailer ? " + checksum" : "") +
         "), the file has " + std::to_string(file_bytes));
  if (count_ == 0) fail("contains no tokens");
  if (version >= 2) {
    // Read through the descriptor, not the mapping: the check must not make the corpus resident.
    Checksummer sum;
    unsigned char buf[1 << 16];
    const int64_t end = kTokenFileHeaderBytes + count_ * width_;
    for (int64_t off = kTokenFileHeaderBytes; off < end;) {
      ssize_t k = ::pread(fd, buf, size_t(std::min<int64_t>(sizeof(buf), end - off)), off);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail(std::string("cannot be read: ") + (k < 0 ? std::strerror(errno) : "it shrank"));
      sum.update(buf, size_t(k));
      off += k;
    }
    const uint64_t stored = get_le(map_ + end, 8);
    if (sum.digest() != stored)
      fail("is corrupt: its token bytes hash to xxh3 " + checksum_hex(sum.digest()) + ", the file recorded " +
           checksum_hex(stored) + "\n  hint: the file was damaged after it was written; run `memgrad data tokenize` again");
  }
  ::close(fd);  // the mapping keeps the file alive
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

void TokenFile::check_range(int64_t begin, int64_t n) const {
  MG_CHECK(begin >= 0 && n >= 0 && begin + n <= count_, "TokenFile: '", path_, "': tokens [", begin, ", ", begin + n,
           ") are outside the file's ", count_, " tokens");
}

uint32_t TokenFile::operator[](int64_t i) const {
  check_range(i, 1);
  return uint32_t(get_le(map_ + kTokenFileHeaderBytes + i * width_, width_));
}

void TokenFile::read(int64_t begin, int64_t n, int64_t* out) const {
  check_range(begin, n);
  const unsigned char* p = map_ + kTokenFileHeaderBytes + begin * width_;
  switch (width_) {
    case 1:
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) out[i] = int64_t(get_le(p + 2 * i, 2));
      break;
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = int64_t(get_le(p + 4 * i, 4));
  }
}

std::vector<uint32_t> TokenFile::read(int64_t begin, int64_t n) const {
  check_range(begin, n);
  std::vector<uint32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = uint32_t(get_le(map_ + kTokenFileHeaderBytes + (begin + i) * width_, width_));
  return v;
}

// ---- tokenize_files -------------------------------------------------------------------------

TokenizeSummary tokenize_files(const std::vector<std::string>& inputs, const std::string& out_path) {
  MG_CHECK(!inputs.empty(), "tokenize_files: no input files or directories were given");
  TokenizeSummary summary;
  for (const std::string& in : inputs) {
    std::error_code ec;
    fs::file_status st = fs::status(in, ec);
    MG_CHECK(fs::exists(st), "tokenize_files: input '", in, "' does not exist");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (!it->is_symlink() && it->is_regular_file() && it->path().extension() != ".dat")
          found.push_back(it->path().string());
      }
      MG_CHECK(!ec, "tokenize_files: cannot list directory '", in, "': ", ec.message());
      std::sort(found.begin(), found.end());
      summary.paths.insert(summary.paths.end(), found.begin(), found.end());
    } else {
      MG_CHECK(fs::is_regular_file(st), "tokenize_files: input '", in, "' is neither a file nor a directory");
      summary.paths.push_back(in);
    }
  }
  TokenFileWriter writer(out_path, 1);
  std::string buf(1 << 16, '\0');
  for (const std::string& path : summary.paths) {
    std::ifstream f(path, std::ios::binary);
    MG_CHECK(f.good(), "tokenize_files: cannot open '", path, "': ", std::strerror(errno));
    while (f) {
      f.read(buf.data(), std::streamsize(buf.size()));
      writer.append_bytes(std::string_view(buf.data(), size_t(f.gcount())));
    }
    MG_CHECK(f.eof(), "tokenize_files: reading '", path, "' failed");
  }
  summary.files = int64_t(summary.paths.size());
  summary.tokens = writer.count();
  MG_CHECK(summary.tokens > 0, "tokenize_files: the corpus is empty: ", summary.files, " file(s) with no bytes from ",
           inputs.size() == 1 ? "'" + inputs[0] + "'" : std::to_string(inputs.size()) + " inputs",
           summary.files == 0 ? " (no regular files found; symlinks and .dat files are skipped)" : "");
  writer.finish();
  return summary;
}

bool is_token_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, 8) && std::memcmp(magic, kTokenFileMagic, 8) == 0;
}

}  // namespace mg
