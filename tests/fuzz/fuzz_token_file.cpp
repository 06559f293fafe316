// Fuzz target: token files (data/token_file.cpp): header, sizes, the version-2 checksum, and
// reading every token of a file that opened.
#include <vector>

#include "core/error.h"
#include "data/token_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mg::fuzz::write_input("f.tokens", data, size);
  try {
    mg::TokenFile f(path);
    std::vector<int64_t> out(size_t(f.size()));
    f.read(0, f.size(), out.data());
    (void)f[f.size() - 1];
  } catch (const mg::Error&) {
  }
  return 0;
}
