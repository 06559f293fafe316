// XXH3-64 checksums (see checksum.h). xxhash.h is compiled inline here (XXH_INLINE_ALL), so the
// library is a build-time header only and memgrad's installed package gains no link dependency.
//
// Note [Checksums] Every file memgrad writes for a run carries XXH3-64 checksums of its data:
// safetensors files one per tensor in "__metadata__" (core/safetensors.cpp), token files one
// trailer over the tokens (data/token_file.cpp), a checkpoint's state.json one over its own
// canonical JSON (apps/run_dir.cpp). Readers verify them and name the file and the tensor on a
// mismatch; files without checksums (other tools' files, older memgrad files) still load.
#include "core/checksum.h"

// GCC 12 misreads xxhash's AVX-512 loop (_mm512_undefined operands) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/error.h"

namespace mg {

uint64_t checksum64(const void* data, size_t n) { return XXH3_64bits(data, n); }

std::string checksum_hex(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = kDigits[v & 15];
  return s;
}

std::optional<uint64_t> parse_checksum_hex(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = (v << 4) | uint64_t(d);
  }
  return v;
}

struct Checksummer::State {
  XXH3_state_t xxh;
};

Checksummer::Checksummer() : state_(std::make_unique<State>()) {
  MG_INTERNAL_ASSERT(XXH3_64bits_reset(&state_->xxh) == XXH_OK, "XXH3 reset failed");
}
Checksummer::~Checksummer() = default;

void Checksummer::update(const void* data, size_t n) {
  if (n == 0) return;
  MG_INTERNAL_ASSERT(XXH3_64bits_update(&state_->xxh, data, n) == XXH_OK, "XXH3 update failed");
}

uint64_t Checksummer::digest() const { return XXH3_64bits_digest(&state_->xxh); }

}  // namespace mg
