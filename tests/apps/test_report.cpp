// `memgrad report`: the text summary of a profiled run directory, and its errors for a missing
// or corrupt memory.json.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "apps/commands.h"
#include "core/memory_profile_test_util.h"

using namespace mg;

TEST_CASE("memgrad report summarises memory.json", "[report][profiler]") {
  const Device d(DeviceType::cpu, 16);
  MemoryProfiler prof({d});
  test::profile_tiny_gpt(prof, d, 1);
  const DeviceMemoryProfile p = prof.summary().device(d);
  const auto dir = std::filesystem::temp_directory_path() / "mg_test_report";
  std::filesystem::remove_all(dir);
  prof.write(dir.string());
  const std::string text = memory_report(dir.string());
  INFO(text);
  CHECK_THAT(text, Catch::Contains("device cpu:16: peak allocated " + format_bytes(p.peak_bytes) + " (" +
                                   std::to_string(p.peak_bytes) + " bytes)"));
  CHECK_THAT(text, Catch::Contains("phase " + std::string(step_phase_name(p.peak_phase))));
  CHECK_THAT(text, Catch::Contains("optimizer_state"));
  CHECK_THAT(text, Catch::Contains("10 largest of the " + std::to_string(p.live_at_peak.size()) + " tensors"));
  // Ten tensor rows after the header.
  const size_t hdr = text.find("allocated in\n");
  REQUIRE(hdr != std::string::npos);
  size_t rows = 0;
  for (size_t i = hdr; i < text.size(); ++i) rows += text[i] == '\n';
  CHECK(rows == 1 + std::min<size_t>(10, p.live_at_peak.size()));

  std::ofstream(dir / "memory.json") << "{\"traceEvents\": [";
  CHECK_THROWS_WITH(memory_report(dir.string()), Catch::Contains("memory.json is not valid JSON"));
  std::ofstream(dir / "memory.json") << "{\"traceEvents\": []}";
  CHECK_THROWS_WITH(memory_report(dir.string()), Catch::Contains("has no memgrad memory profile"));
  // Wrong JSON types where the format is looked up (found by fuzzing): errors, not type exceptions.
  for (const char* bad : {"{\"memgrad\": {\"format\": 1}}", "{\"memgrad\": 7}", "[1, 2]"}) {
    std::ofstream(dir / "memory.json") << bad;
    CHECK_THROWS_WITH(memory_report(dir.string()), Catch::Contains("has no memgrad memory profile"));
  }
  std::filesystem::remove(dir / "memory.json");
  CHECK_THROWS_WITH(memory_report(dir.string()), Catch::Contains("memory.json: no memory profile"));
  std::filesystem::remove_all(dir);
}
