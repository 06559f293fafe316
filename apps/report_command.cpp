// `memgrad report RUN_DIR`: a text summary of the memory profile a run wrote (memory.json's
// "memgrad" object, written by MemoryProfiler::write): peak per device and category, the 10
// largest tensors alive at the peak, and the step phase in which the peak happened.
// `memgrad report --run RUN_DIR`: the run's own per-device peaks by category (device_peaks.json,
// written by every training run; a split run has a row per device) and each device's highest step
// peak in metrics.csv, then the profile above when the run was trained with --profile.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/commands.h"
#include "apps/device_peaks_file.h"
#include "apps/model_parallel_options.h"
#include "apps/run_dir.h"
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
  MG_CHECK(j.is_object() && j.contains("memgrad") && json_has_format(j["memgrad"], "memgrad-memory-profile"),
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

std::string run_memory_report(const std::string& run_dir, size_t top) {
  const RunDir run(run_dir);
  const nlohmann::json config = run.read_config();  // "... is not a run directory" otherwise
  const ModelParallelOptions parallel = ModelParallelOptions::from_json(config.value("model_parallel", nlohmann::json()));
  const DevicePeaksFile peaks = read_device_peaks(run_dir);
  std::ostringstream o;
  o << "run " << run_dir << ": " << (parallel.active() ? parallel.str() : "on " + config.value("device", std::string("?")))
    << "\nper-device peaks by category over the steps after the first of " << peaks.steps
    << (peaks.steps == 1 ? " (the only one)" : "") << " (device_peaks.json):\n"
    << device_peaks_table(peaks.measured, peaks.predicted);
  // metrics.csv: each device's highest step peak over the whole run (the first step too).
  if (std::filesystem::exists(run.metrics_path())) {
    const auto rows = read_metrics(run.metrics_path());
    std::string line;
    for (const DevicePeak& p : peaks.measured) {
      const std::string column = parallel.active() ? "peak_bytes@" + p.device.str() : "peak_bytes";
      int64_t highest = -1;
      for (const auto& row : rows)
        if (auto it = row.find(column); it != row.end() && !it->second.empty())
          highest = std::max(highest, int64_t(std::stod(it->second)));
      if (highest >= 0) line += (line.empty() ? "" : ", ") + p.device.str() + " " + format_bytes(highest);
    }
    if (!line.empty()) o << "highest step peak in metrics.csv (" << rows.size() << " steps): " << line << "\n";
  }
  if (std::filesystem::exists(std::filesystem::path(run_dir) / "memory.json"))
    o << "memory profile (--profile, one step):\n" << memory_report(run_dir, top);
  return o.str();
}

void add_report_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto run = std::make_shared<std::string>();
  auto top = std::make_shared<size_t>(10);
  CLI::App* cmd = app.add_subcommand("report", "summarise the memory of a run directory: the profile (memory.json), or "
                                               "with --run its per-device peaks by category first");
  CLI::Option* positional =
      cmd->add_option("run_dir", *dir, "run directory written by a training command with --profile");
  CLI::Option* run_opt = cmd->add_option("--run", *run, "run directory of any training run (a split run: a row per "
                                                        "device), with its profile when it has one");
  positional->excludes(run_opt);
  cmd->add_option("--top", *top, "how many of the largest tensors at the peak to list")->capture_default_str();
  cmd->callback([dir, run, top] {
    MG_CHECK(!dir->empty() || !run->empty(), "report: give a run directory (memgrad report RUN_DIR or --run RUN_DIR)");
    std::printf("%s", (run->empty() ? memory_report(*dir, *top) : run_memory_report(*run, *top)).c_str());
  });
}

}  // namespace mg
