// Token files: a corpus as one flat array of token ids on disk, memory-mapped read-only so a
// training run reads only the windows it samples and its memory stays flat however large the
// corpus is (the "data streaming" technique). Format (little-endian):
//   "MGTOKENS" (8 bytes) | u32 version = 1 | u32 token width in bytes (1, 2, 4) | u64 count |
//   count tokens of `width` bytes each | (version 2) u64 XXH3-64 of the token bytes.
// Opening a version-2 file reads it once to verify the checksum (Note [Checksums]); version-1
// files (no checksum) still open.
// Writers go to a temporary file and rename it into place, so a reader never sees half a file.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/checksum.h"

namespace mg {

inline constexpr char kTokenFileMagic[9] = "MGTOKENS";
inline constexpr uint32_t kTokenFileVersion = 2;  // writes 2, reads 1 and 2
inline constexpr int64_t kTokenFileTrailerBytes = 8;  // version 2: the checksum
inline constexpr int64_t kTokenFileHeaderBytes = 24;

// Streams tokens into a new token file without holding them in memory.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, int width);
  ~TokenFileWriter();  // removes the temporary file unless finish() ran
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Throws when a token does not fit in `width` bytes.
  void append(std::span<const uint32_t> tokens);
  // Appends each byte as a token (the byte tokenizer's output, without a copy).
  void append_bytes(std::string_view bytes);
  int64_t count() const { return count_; }
  // Writes the header's count, syncs, and renames the file into place.
  void finish();

 private:
  void write_raw(const void* data, size_t n);
  std::string path_, tmp_path_;
  int width_;
  int64_t count_ = 0;
  std::FILE* file_ = nullptr;
  Checksummer checksum_;  // of the token bytes written so far
};

// Writes a whole token file at once (atomic: temporary file + rename).
void write_token_file(const std::string& path, std::span<const uint32_t> tokens, int width);

// A read-only memory mapping of a validated token file.
class TokenFile {
 public:
  // Throws naming the file for: missing, too short, bad magic, version, width, or a size that
  // is not header + count * width (+ trailer) (truncated or trailing bytes), zero tokens, or
  // (version 2) token bytes that do not match the checksum.
  explicit TokenFile(std::string path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return count_; }  // number of tokens
  int width() const { return width_; }
  const std::string& path() const { return path_; }

  uint32_t operator[](int64_t i) const;
  // Tokens [begin, begin + n) converted to int64 into out[0..n): touches only those bytes.
  void read(int64_t begin, int64_t n, int64_t* out) const;
  std::vector<uint32_t> read(int64_t begin, int64_t n) const;

 private:
  void check_range(int64_t begin, int64_t n) const;
  std::string path_;
  const unsigned char* map_ = nullptr;  // the whole file
  size_t map_bytes_ = 0;
  int width_ = 0;
  int64_t count_ = 0;
};

struct TokenizeSummary {
  int64_t files = 0;
  int64_t tokens = 0;
  std::vector<std::string> paths;  // the files read, in order
};

// Byte-tokenizes and concatenates text files into one token file (width 1). Each input is a
// file or a directory; a directory contributes every regular file under it, sorted by path,
// skipping symlinks and fortune's `.dat` index files (fortune's `.u8` links duplicate the
// text). Bytes pass through unchanged (UTF-8 stays UTF-8). An empty corpus is an error.
TokenizeSummary tokenize_files(const std::vector<std::string>& inputs, const std::string& out_path);

// True when `path` is a readable file that starts with kTokenFileMagic (text files are not).
bool is_token_file(const std::string& path);

}  // namespace mg
