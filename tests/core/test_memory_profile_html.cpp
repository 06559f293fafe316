// memory.html in headless Chromium (Debian's `chromium`, installed by scripts/setup): the page
// renders (its inline script ran over the parsed SVG), the static SVG timeline is there, and the
// peak's numbers on the page match the profiler's summary.
#include <catch2/catch.hpp>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/memory_profile_test_util.h"

using namespace mg;

namespace {
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    std::string cmd = std::string("command -v ") + name + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) continue;
    std::array<char, 512> buf{};
    std::string out;
    while (fgets(buf.data(), int(buf.size()), p)) out += buf.data();
    pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    if (!out.empty()) return out;
  }
  return "";
}

std::string run(const std::string& cmd, int& status) {
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  std::string out;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  status = pclose(p);
  return out;
}
}  // namespace

TEST_CASE("memory.html renders in headless chromium with the profiler's peak", "[profiler][chromium][slow]") {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    FAIL("chromium not found on PATH: the memory.html check needs Debian's chromium package; "
         "scripts/setup installs it");
  const Device d(DeviceType::cpu, 15);
  MemoryProfiler prof({d});
  test::profile_tiny_gpt(prof, d, 2);
  const DeviceMemoryProfile p = prof.summary().device(d);
  const auto dir = std::filesystem::temp_directory_path() / "mg_test_profile_html";
  std::filesystem::remove_all(dir);
  prof.write(dir.string());
  const std::string page = std::filesystem::absolute(dir / "memory.html").string();
  const std::string profile_dir = (dir / "chromium-profile").string();
  int status = 0;
  const std::string dom = run("timeout 60 '" + chromium +
                                  "' --headless --no-sandbox --disable-gpu --user-data-dir='" + profile_dir +
                                  "' --dump-dom 'file://" + page + "' 2>/dev/null",
                              status);
  INFO("chromium exit status " << status << ", DOM of " << dom.size() << " bytes");
  REQUIRE(status == 0);
  REQUIRE(dom.find("<svg") != std::string::npos);
  // The inline script ran in the browser and found the stacked areas in the parsed SVG.
  const std::string marker = "data-rendered-areas=\"";
  const size_t at = dom.find(marker);
  REQUIRE(at != std::string::npos);
  const int areas = std::atoi(dom.c_str() + at + marker.size());
  CHECK(areas >= 3);  // at least parameters, gradients, optimizer state and activations are drawn
  // The peak's numbers match the summary.
  const std::string peak = std::to_string(p.peak_bytes);
  CHECK(dom.find("class=\"peak-summary\" data-peak-bytes=\"" + peak + "\"") != std::string::npos);
  CHECK(dom.find("<span class=\"peak-bytes\">" + peak + "</span>") != std::string::npos);
  CHECK(dom.find("(" + peak + " B), " + std::string(step_phase_name(p.peak_phase))) != std::string::npos);
  CHECK(dom.find(format_bytes(p.peak_bytes)) != std::string::npos);
  // The largest tensor at the peak is the first row of the table.
  REQUIRE(!p.live_at_peak.empty());
  CHECK(dom.find("<td>" + std::to_string(p.live_at_peak[0].bytes) + "</td>") != std::string::npos);
  std::filesystem::remove_all(dir);
}
