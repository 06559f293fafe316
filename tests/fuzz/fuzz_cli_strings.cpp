// Fuzz target: the command line's size and device strings: parse_bytes ("512MiB", "1.5GiB",
// --memory-limit and friends) and Device ("cpu:1", "cuda:0", "meta"); what parses is printed.
#include <string>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(mg::fuzz::as_text(data, size));
  try {
    const size_t n = mg::parse_bytes(s);
    (void)mg::format_bytes(int64_t(n));
  } catch (const mg::Error&) {
  }
  try {
    mg::Device d(s);
    (void)d.str();
  } catch (const mg::Error&) {
  }
  return 0;
}
