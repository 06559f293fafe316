// Placement: the map syntax (parse / str), the checks against a model's layout, and moving the
// modules. Note [Placement checks]: every problem is collected before anything moves, so a bad
// placement fails with one message and leaves the model where it was.
#include "parallel/placement.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "core/allocator.h"
#include "core/cuda/backend.h"

namespace mg {
namespace {

std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\n");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.push_back(trim(std::string_view(s).substr(start, pos == std::string::npos ? std::string::npos : pos - start)));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

bool parse_int(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v >= 0;
}

// "h.0-2.attn" -> h.0.attn, h.1.attn, h.2.attn (every component may be a range).
std::vector<std::string> expand_path(const std::string& path, const std::string& spec) {
  std::vector<std::string> out{""};
  for (const std::string& comp : split_on(path, '.')) {
    MG_CHECK(!comp.empty(), "placement '", spec, "': module path '", path, "' has an empty component");
    std::vector<std::string> parts;
    const size_t dash = comp.find('-');
    if (dash == std::string::npos) {
      parts.push_back(comp);
    } else {
      int64_t a = 0, b = 0;
      MG_CHECK(parse_int(comp.substr(0, dash), a) && parse_int(comp.substr(dash + 1), b) && a <= b, "placement '",
               spec, "': bad range '", comp, "' in '", path, "' (expected A-B with numbers A <= B)");
      for (int64_t i = a; i <= b; ++i) parts.push_back(std::to_string(i));
    }
    std::vector<std::string> next;
    for (const auto& prefix : out)
      for (const auto& p : parts) next.push_back(prefix.empty() ? p : prefix + "." + p);
    out = std::move(next);
  }
  return out;
}


}  // namespace

bool device_exists(Device d, std::string& why) {
  if (!d.is_cuda()) return true;  // cpu:N and meta:N always exist (the index is checked by Device)
  const int n = backend_available(DeviceType::cuda) ? cuda::device_count() : 0;
  if (d.index < n) return true;
  why = n == 0 ? "no CUDA device (" + cuda::device_count_error() + ")" : std::to_string(n) + " CUDA device(s)";
  return false;
}

Placement Placement::parse(const std::string& spec) {
  Placement p;
  std::map<std::string, Device> seen;
  const std::vector<std::string> groups = split_on(spec, ';');
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string& group = groups[g];
    if (group.empty() && g + 1 == groups.size() && g > 0) break;  // a trailing ';'
    const size_t eq = group.rfind('=');
    MG_CHECK(eq != std::string::npos, "placement '", spec, "': group ", g + 1, " '", group,
             "' has no '=device' (expected e.g. 'wte,wpe,h.0-5=cpu:0;h.6-11,ln_f=cpu:1')");
    const std::string dev_str = trim(std::string_view(group).substr(eq + 1));
    Device dev;
    try {
      dev = Device(dev_str);
    } catch (const Error& e) {
      MG_THROW("placement '", spec, "': group ", g + 1, ": ", e.what());
    }
    const std::string paths = trim(std::string_view(group).substr(0, eq));
    MG_CHECK(!paths.empty(), "placement '", spec, "': group ", g + 1, " names no module before '=", dev_str, "'");
    for (const std::string& path : split_on(paths, ',')) {
      MG_CHECK(!path.empty(), "placement '", spec, "': group ", g + 1, " has an empty module path");
      for (std::string& full : expand_path(path, spec)) {
        auto [it, fresh] = seen.emplace(full, dev);
        MG_CHECK(fresh, "placement '", spec, "': '", full, "' is placed twice (", it->second.str(), " and ",
                 dev.str(), ")");
        p.entries.emplace_back(std::move(full), dev);
      }
    }
  }
  MG_CHECK(!p.entries.empty(), "placement '", spec, "' places no module");
  return p;
}

std::string fold_paths(const std::vector<std::string>& paths) {
  // Key: the path with its first numeric component replaced by '#'; numbers collected per key.
  std::vector<std::string> keys;
  std::map<std::string, std::vector<int64_t>> numbers;
  for (const auto& path : paths) {
    std::vector<std::string> comps = split_on(path, '.');
    size_t k = 0;
    int64_t n = -1;
    for (; k < comps.size(); ++k)
      if (parse_int(comps[k], n)) break;
    std::string key;
    if (k == comps.size()) {
      key = path;  // no number: stands for itself
      n = -1;
    } else {
      comps[k] = "#";
      for (size_t i = 0; i < comps.size(); ++i) key += (i ? "." : "") + comps[i];
    }
    if (!numbers.count(key)) keys.push_back(key);
    numbers[key].push_back(n);
  }
  std::string out;
  auto emit = [&](const std::string& s) { out += (out.empty() ? "" : ",") + s; };
  for (const auto& key : keys) {
    std::vector<int64_t> v = numbers[key];
    if (v.front() < 0) {
      emit(key);
      continue;
    }
    std::sort(v.begin(), v.end());
    const size_t hash = key.find('#');
    for (size_t i = 0; i < v.size();) {
      size_t j = i;
      while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
      const std::string num = i == j ? std::to_string(v[i]) : std::to_string(v[i]) + "-" + std::to_string(v[j]);
      emit(key.substr(0, hash) + num + key.substr(hash + 1));
      i = j + 1;
    }
  }
  return out;
}

std::string Placement::str() const {
  std::string out;
  for (const Device& d : devices()) {
    std::vector<std::string> paths;
    for (const auto& [path, dev] : entries)
      if (dev == d) paths.push_back(path);
    out += (out.empty() ? "" : ";") + fold_paths(paths) + "=" + d.str();
  }
  return out;
}

std::vector<Device> Placement::devices() const {
  std::vector<Device> out;
  for (const auto& [_, d] : entries)
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

Device ResolvedPlacement::device_of(const std::string& leaf) const {
  for (const auto& [path, d] : leaves)
    if (path == leaf) return d;
  MG_THROW("placement: '", leaf, "' is not a placeable leaf of this ", layout.model, " (", layout.hint, ")");
}

std::string ResolvedPlacement::modules_on(Device d) const {
  // A block whose leaves all live on d is named as the block.
  std::vector<std::string> names;
  for (const auto& [leaf, dev] : leaves) {
    if (dev != d) continue;
    std::string name = leaf;
    for (const auto& block : layout.blocks) {
      if (!path_within(leaf, block)) continue;
      bool whole = true;
      for (const auto& [other, od] : leaves)
        if (path_within(other, block) && od != d) whole = false;
      if (whole) name = block;
    }
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  return names.empty() ? "(nothing)" : fold_paths(names);
}

std::string ResolvedPlacement::str() const {
  std::vector<Device> devices;
  for (const auto& [_, d] : leaves)
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  std::string out;
  for (const Device& d : devices) {
    if (!out.empty()) out += "; ";
    out += d.str();
    out += " holds ";
    out += modules_on(d);
  }
  return out;
}

OutOfMemoryError with_placement(const OutOfMemoryError& e, const ResolvedPlacement& r) {
  return OutOfMemoryError(std::string(e.what()) + "\n  model split over devices: " + r.str());
}

ResolvedPlacement resolve_placement(Module& model, const Placement& placement) {
  ResolvedPlacement r{model_layout(model), {}};
  const ModelLayout& layout = r.layout;
  std::set<std::string> modules;
  for (const auto& [name, _] : model.named_modules()) modules.insert(name);

  std::vector<std::string> problems;
  std::vector<std::pair<std::string, Device>> valid;  // entries that name a placeable module
  for (const auto& [path, dev] : placement.entries) {
    std::string why;
    if (!modules.count(path)) problems.push_back("unknown module path '" + path + "'");
    else if (!layout.placeable(path)) problems.push_back("'" + path + "' cannot be placed on its own");
    else valid.emplace_back(path, dev);
    if (!device_exists(dev, why)) problems.push_back("device " + dev.str() + " does not exist: " + why);
  }
  std::vector<std::string> unplaced;
  for (const auto& leaf : layout.leaves) {
    std::vector<std::pair<std::string, Device>> by;
    for (const auto& [path, dev] : valid)
      if (path_within(leaf, path)) by.emplace_back(path, dev);
    if (by.empty()) {
      unplaced.push_back(leaf);
    } else if (by.size() > 1) {
      std::string msg = "'" + leaf + "' is placed twice:";
      for (size_t i = 0; i < by.size(); ++i) msg += (i ? " and" : "") + (" by '" + by[i].first + "=" + by[i].second.str() + "'");
      problems.push_back(msg);
    } else {
      r.leaves.emplace_back(leaf, by.front().second);
    }
  }
  if (!unplaced.empty()) problems.push_back("not placed: " + fold_paths(unplaced));
  if (!problems.empty()) {
    std::string msg = "placement '" + placement.str() + "' does not fit this " + layout.model + ":";
    for (const auto& p : problems) msg += "\n  " + p;
    MG_THROW(msg, "\n  placeable modules: ", layout.hint);
  }
  for (const auto& [name, _] : model.named_parameters()) {
    bool inside = false;
    for (const auto& leaf : layout.leaves) inside = inside || path_within(name, leaf);
    MG_INTERNAL_ASSERT(inside, "parameter '", name, "' lies in no placeable module of the ", layout.model, " layout");
  }
  return r;
}

ResolvedPlacement apply_placement(Module& model, const Placement& placement) {
  ResolvedPlacement r = resolve_placement(model, placement);
  std::map<std::string, Module*> modules;
  for (const auto& [name, m] : model.named_modules()) modules[name] = m;
  for (const auto& [leaf, dev] : r.leaves) modules.at(leaf)->to(dev);
  // Input devices: a placeable module runs on the device of its leaves when they share one; a
  // module split across devices (a GPT block under attention-mlp) leaves the moves to its parts.
  std::vector<std::string> placeable = r.layout.leaves;
  placeable.insert(placeable.end(), r.layout.blocks.begin(), r.layout.blocks.end());
  placeable.insert(placeable.end(), r.layout.groups.begin(), r.layout.groups.end());
  for (const auto& path : placeable) {
    std::optional<Device> dev;
    bool uniform = true;
    for (const auto& [leaf, d] : r.leaves) {
      if (!path_within(leaf, path)) continue;
      if (dev && *dev != d) uniform = false;
      dev = d;
    }
    modules.at(path)->set_input_device(uniform ? dev : std::nullopt);
  }
  return r;
}

}  // namespace mg
