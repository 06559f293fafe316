// Checksums of the bytes memgrad writes (Note [Checksums]): XXH3-64 from the xxHash library
// (Debian libxxhash-dev, compiled inline into core/checksum.cpp, so nothing extra is linked), as
// 16 lowercase hex digits in files. One-shot for a buffer in memory, streaming for data written
// piece by piece (token files, tensors staged in chunks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace mg {

// XXH3-64 of n bytes (seed 0).
uint64_t checksum64(const void* data, size_t n);

// "0123456789abcdef": always 16 digits, so a placeholder can be rewritten in place.
std::string checksum_hex(uint64_t v);
// The value of 16 hex digits; nullopt for anything else.
std::optional<uint64_t> parse_checksum_hex(std::string_view s);

// The same XXH3-64 over bytes fed in pieces: Checksummer c; c.update(a, n); c.update(b, m);
// c.digest() == checksum64(a ++ b).
class Checksummer {
 public:
  Checksummer();
  ~Checksummer();
  Checksummer(const Checksummer&) = delete;
  Checksummer& operator=(const Checksummer&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mg
