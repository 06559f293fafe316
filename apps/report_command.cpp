// `memgrad report RUN_DIR`: a text summary of the memory profile a run wrote (memory.json's
// "memgrad" object, written by MemoryProfiler::write): peak per device and category, the 10
// largest tensors alive at the peak, and the step phase in which the peak happened.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/commands.h"
#include "core/allocator.h"
#include "core/error.h"

namespace mg {

std::string memory_report(const std::string& run_dir, size_t top) {
  const std::string path = (std::filesystem::path(run_dir) / "memory.json").string();
  std::ifstream f(path);
  MG_CHECK(f, "cannot open ", path, ": no memory profile in this run directory (train with --profile)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    MG_CHECK(false, path, " is not valid JSON: ", e.what());
  }
  MG_CHECK(j.is_object() && j.contains("memgrad") && j["memgrad"].value("format", "") == "memgrad-memory-profile",
           path, " has no memgrad memory profile (no \"memgrad\" object of format memgrad-memory-profile)");
  std::ostringstream o;
  char line[512];
  try {
    for (const auto& d : j["memgrad"].at("devices")) {
      const int64_t peak = d.at("peak_bytes").get<int64_t>();
      std::snprintf(line, sizeof line, "device %s: peak allocated %s (%lld bytes) at %.2f ms, phase %s, %lld events\n",
                    d.at("device").get<std::string>().c_str(), format_bytes(peak).c_str(), (long long)peak,
                    d.at("peak_time_us").get<double>() / 1000.0, d.at("peak_phase").get<std::string>().c_str(),
                    (long long)d.at("num_events").get<int64_t>());
      o << line;
      std::snprintf(line, sizeof line, "  %-16s %14s %14s\n", "category", "at peak", "own peak");
      o << line;
      for (const auto& [name, v] : d.at("at_peak").items()) {
        std::snprintf(line, sizeof line, "  %-16s %14s %14s\n", name.c_str(), format_bytes(v.get<int64_t>()).c_str(),
                      format_bytes(d.at("category_peak").at(name).get<int64_t>()).c_str());
        o << line;
      }
      const auto& live = d.at("live_at_peak");
      std::snprintf(line, sizeof line, "  %zu largest of the %zu tensors alive at the peak:\n",
                    std::min(top, live.size()), live.size());
      o << line;
      std::snprintf(line, sizeof line, "  %12s  %-16s %-20s %-24s %s\n", "size", "category", "op", "module", "allocated in");
      o << line;
      for (size_t i = 0; i < live.size() && i < top; ++i) {
        const auto& t = live[i];
        std::snprintf(line, sizeof line, "  %12s  %-16s %-20s %-24s %s\n",
                      format_bytes(t.at("bytes").get<int64_t>()).c_str(), t.at("category").get<std::string>().c_str(),
                      t.at("op").get<std::string>().c_str(), t.at("module").get<std::string>().c_str(),
                      t.at("phase").get<std::string>().c_str());
        o << line;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    MG_CHECK(false, path, " has a malformed memgrad profile: ", e.what());
  }
  return o.str();
}

void add_report_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto top = std::make_shared<size_t>(10);
  CLI::App* cmd = app.add_subcommand("report", "summarise the memory profile of a run directory (memory.json)");
  cmd->add_option("run_dir", *dir, "run directory written by a training command with --profile")->required();
  cmd->add_option("--top", *top, "how many of the largest tensors at the peak to list")->capture_default_str();
  cmd->callback([dir, top] { std::printf("%s", memory_report(*dir, *top).c_str()); });
}

}  // namespace mg
