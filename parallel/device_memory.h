// Per-device memory of a model split over devices: each device's peak allocated bytes and the
// peak of every category, read from its allocator (or predicted on meta by parallel/split.h),
// and a table that puts measured and predicted peaks side by side.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/memory_category.h"

namespace mg {

struct DevicePeak {
  Device device;
  int64_t peak = 0;                                       // peak allocated bytes
  std::array<int64_t, kNumMemoryCategories> category{};   // each category's own peak
  std::string modules;                                    // what lives there ("wte,wpe,h.0-3")

  int64_t of(MemoryCategory c) const { return category[size_t(c)]; }
};

// The allocator statistics of each device now (peaks since its last reset_peak_stats).
std::vector<DevicePeak> device_peaks(const std::vector<Device>& devices);

// One row per device: peak, parameter, gradient, optimizer state, activation, other (the rest)
// and the modules; with `predicted` (same devices, same order) a predicted-peak column too.
std::string device_peaks_table(const std::vector<DevicePeak>& measured, const std::vector<DevicePeak>& predicted = {});

}  // namespace mg
