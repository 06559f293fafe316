// Per-device peaks from the allocators and their table.
#include "parallel/device_memory.h"

#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "core/error.h"

namespace mg {

std::vector<DevicePeak> device_peaks(const std::vector<Device>& devices) {
  std::vector<DevicePeak> out;
  for (const Device& d : devices) {
    const MemoryStats s = memory_stats(d);
    DevicePeak p;
    p.device = d;
    p.peak = s.allocated.peak;
    for (MemoryCategory c : kAllMemoryCategories) p.category[size_t(c)] = s.category(c).peak;
    out.push_back(p);
  }
  return out;
}

std::string device_peaks_table(const std::vector<DevicePeak>& measured, const std::vector<DevicePeak>& predicted) {
  MG_CHECK(predicted.empty() || predicted.size() == measured.size(), "device_peaks_table: ", measured.size(),
           " measured devices but ", predicted.size(), " predicted");
  auto fmt = [](int64_t b) { return format_bytes(b); };
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-8s %12s%s %12s %12s %12s %12s %12s  %s\n", "device", "peak",
                predicted.empty() ? "" : "    predicted", "parameter", "gradient", "optim state", "activation",
                "other", "modules");
  out += line;
  for (size_t i = 0; i < measured.size(); ++i) {
    const DevicePeak& m = measured[i];
    int64_t rest = 0;
    for (MemoryCategory c : {MemoryCategory::workspace, MemoryCategory::input, MemoryCategory::other}) rest += m.of(c);
    std::string pred;
    if (!predicted.empty()) {
      const std::string p = fmt(predicted[i].peak);
      pred.assign(13 - std::min<size_t>(12, p.size()), ' ');
      pred += p;
    }
    const std::string& modules = !m.modules.empty() ? m.modules : (predicted.empty() ? m.modules : predicted[i].modules);
    std::snprintf(line, sizeof line, "%-8s %12s%s %12s %12s %12s %12s %12s  %s\n", m.device.str().c_str(),
                  fmt(m.peak).c_str(), pred.c_str(), fmt(m.of(MemoryCategory::parameter)).c_str(),
                  fmt(m.of(MemoryCategory::gradient)).c_str(), fmt(m.of(MemoryCategory::optimizer_state)).c_str(),
                  fmt(m.of(MemoryCategory::activation)).c_str(), fmt(rest).c_str(), modules.c_str());
    out += line;
  }
  return out;
}

}  // namespace mg
