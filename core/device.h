// Device: where a tensor's memory lives. `cpu:N` is host memory with its own pool, budget and
// statistics per index (so cpu:0 and cpu:1 act like two cards); `cuda:N` is a GPU; `meta`
// holds shapes and bytes but no data, so running a model on it gives its exact memory timeline
// (`meta:N` are separate meta pools, so a model split over K devices can be measured on K metas).
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace mg {

enum class DeviceType : uint8_t { cpu, cuda, meta };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  Device(std::string_view spec);  // NOLINT: "cpu", "cpu:1", "cuda:0", "meta", "meta:1"
  Device(const char* spec) : Device(std::string_view(spec)) {}  // NOLINT

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_meta() const { return type == DeviceType::meta; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

inline constexpr int kMaxDevicesPerType = 16;
inline const Device kCPU{DeviceType::cpu, 0};
inline const Device kMeta{DeviceType::meta, 0};
// The host pool datasets live in (the last cpu index): host memory that no training device uses,
// so a dataset is accounted where it lives and only the batches reach a device's budget.
inline const Device kHostData{DeviceType::cpu, kMaxDevicesPerType - 1};

std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace mg

template <>
struct std::hash<mg::Device> {
  size_t operator()(const mg::Device& d) const { return size_t(d.type) * 131 + size_t(d.index); }
};
