// Parsing and printing of device specs.
#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace mg {

Device::Device(std::string_view spec) {
  auto colon = spec.find(':');
  std::string_view kind = spec.substr(0, colon);
  if (kind == "cpu") type = DeviceType::cpu;
  else if (kind == "cuda") type = DeviceType::cuda;
  else if (kind == "meta") type = DeviceType::meta;
  else MG_THROW("bad device '", spec, "': expected cpu, cpu:N, cuda:N, meta or meta:N");
  index = 0;
  if (colon != std::string_view::npos) {
    std::string_view num = spec.substr(colon + 1);
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    MG_CHECK(ec == std::errc() && p == num.data() + num.size() && !num.empty(),
             "bad device '", spec, "': the index after ':' must be a number");
    MG_CHECK(index >= 0 && index < kMaxDevicesPerType, "bad device '", spec, "': index must be in [0, ",
             kMaxDevicesPerType, ")");
  }
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu: return "cpu:" + std::to_string(index);
    case DeviceType::cuda: return "cuda:" + std::to_string(index);
    case DeviceType::meta: return index == 0 ? "meta" : "meta:" + std::to_string(index);
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace mg
