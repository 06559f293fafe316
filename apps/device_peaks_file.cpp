// device_peaks.json (see device_peaks_file.h): DevicePeak to JSON and back.
#include "apps/device_peaks_file.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "apps/run_dir.h"
#include "core/error.h"

namespace mg {
namespace {

nlohmann::json to_json(const std::vector<DevicePeak>& peaks) {
  nlohmann::json out = nlohmann::json::array();
  for (const DevicePeak& p : peaks) {
    nlohmann::json cat = nlohmann::json::object();
    for (MemoryCategory c : kAllMemoryCategories) cat[std::string(category_name(c))] = p.of(c);
    out.push_back({{"device", p.device.str()}, {"peak_bytes", p.peak}, {"category_peak", cat}, {"modules", p.modules}});
  }
  return out;
}

std::vector<DevicePeak> from_json(const nlohmann::json& j) {
  std::vector<DevicePeak> out;
  for (const auto& e : j) {
    DevicePeak p{.device = Device(e.at("device").get<std::string>()), .peak = e.at("peak_bytes").get<int64_t>()};
    for (MemoryCategory c : kAllMemoryCategories)  // a category missing from the file reads as 0
      p.category[size_t(c)] = e.at("category_peak").value(std::string(category_name(c)), int64_t(0));
    p.modules = e.value("modules", "");
    out.push_back(p);
  }
  return out;
}

}  // namespace

std::string device_peaks_path(const std::string& run_dir) { return RunDir(run_dir).file("device_peaks.json"); }

void write_device_peaks(const std::string& run_dir, const DevicePeaksFile& f) {
  write_json_file(device_peaks_path(run_dir), {{"format", "memgrad-device-peaks"},
                                               {"version", 1},
                                               {"steps", f.steps},
                                               {"peaks_of", "steps after the first (the only step when one ran)"},
                                               {"devices", to_json(f.measured)},
                                               {"predicted", to_json(f.predicted)}});
}

DevicePeaksFile read_device_peaks(const std::string& run_dir) {
  const std::string path = device_peaks_path(run_dir);
  MG_CHECK(std::filesystem::exists(path), "cannot open ", path, ": the run wrote no per-device peaks");
  const nlohmann::json j = read_json_file(path);
  MG_CHECK(json_has_format(j, "memgrad-device-peaks"), path,
           " is not a device_peaks file (no \"format\": \"memgrad-device-peaks\")");
  DevicePeaksFile f;
  try {
    f.measured = from_json(j.at("devices"));
    f.predicted = from_json(j.value("predicted", nlohmann::json::array()));
    f.steps = j.value("steps", int64_t(0));
  } catch (const nlohmann::json::exception& e) {
    MG_THROW(path, " is malformed: ", e.what());
  } catch (const Error& e) {  // a bad device name
    MG_THROW(path, " is malformed: ", e.what());
  }
  MG_CHECK(f.predicted.empty() || f.predicted.size() == f.measured.size(), path, " predicts ", f.predicted.size(),
           " devices but measured ", f.measured.size());
  return f;
}

}  // namespace mg
