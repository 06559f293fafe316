// Progress lines without a terminal (a pipe, a log file, CI): each line carries the step, loss,
// throughput, memory and the time left, and a validation result is a line of its own instead of a
// value repeated on every later line.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "apps/progress.h"

using namespace mg;

namespace {

std::string lines_of(const std::function<void(Progress&)>& drive, int64_t total) {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    Progress p("gpt train", total, "tok/s", ProgressStyle::automatic, f, 1);  // a file: plain lines
    drive(p);
    p.finish();
  }
  std::rewind(f);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), f)) out += buf;
  std::fclose(f);
  return out;
}

}  // namespace

TEST_CASE("progress lines on a file show step, throughput, memory and time left", "[apps]") {
  const std::string out = lines_of(
      [](Progress& p) {
        for (int64_t s = 1; s <= 3; ++s)
          p.update({.done = s, .loss = 2.5, .throughput = 1000.0 * double(s), .allocated = 1 << 20,
                    .peak = 2 << 20, .limit = 0, .extra = "lr 1.00e-03"});
        p.note("step 3/4: validation loss 2.4000 (8 windows)");
      },
      4);
  INFO(out);
  CHECK(out.find("\r") == std::string::npos);  // no bar redraws in a file
  CHECK(out.find("step 2/4  loss 2.5000  2000.0 tok/s  mem 1.00 MiB / peak 2.00 MiB") != std::string::npos);
  CHECK(out.find("eta ") != std::string::npos);
  CHECK(out.find("step 3/4: validation loss 2.4000") != std::string::npos);
}
