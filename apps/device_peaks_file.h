// device_peaks.json: what a training run leaves about its memory per device, so `memgrad report
// --run DIR` can show it after the run without a profile. One entry per device the model lived on
// (a split run's devices in placement order, or the one training device): the steady peak (steps
// after the first), each category's own peak, the modules there, and balanced's prediction.
#pragma once
#include <string>
#include <vector>

#include "parallel/device_memory.h"

namespace mg {

struct DevicePeaksFile {
  std::vector<DevicePeak> measured;
  std::vector<DevicePeak> predicted{};  // balanced: each device's peak predicted on meta; else empty
  int64_t steps = 0;                    // steps the peaks were measured over (this process's)
};

// Written atomically into `run_dir`.
void write_device_peaks(const std::string& run_dir, const DevicePeaksFile& f);
// Throws naming the file when it is missing, not JSON, or not a device_peaks file.
DevicePeaksFile read_device_peaks(const std::string& run_dir);
std::string device_peaks_path(const std::string& run_dir);

}  // namespace mg
