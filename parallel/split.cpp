// Split strategies: attention-mlp and stages:K as placements, the meta measurement of a placed
// training step, and balanced's search over cut points.
// Note [Balanced on meta]: meta:N pools are separate like cpu:N, so the placed model runs on
// meta:1..meta:K exactly as it will on the real devices (same allocations in the same order,
// to() copies included): each device's predicted peak is the allocator's peak on its meta twin.
#include "parallel/split.h"

#include <algorithm>
#include <optional>
#include <charconv>
#include <cstdio>
#include <map>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "optim/adam.h"

namespace mg {
namespace {

std::string devices_str(const std::vector<Device>& devices) {
  std::string s;
  for (const auto& d : devices) {
    if (!s.empty()) s += ",";
    s += d.str();
  }
  return s;
}

void check_devices(const std::vector<Device>& devices) {
  MG_CHECK(!devices.empty(), "model parallelism: no devices given (e.g. --devices cpu:0,cpu:1)");
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      MG_CHECK(devices[i] != devices[j], "model parallelism: device ", devices[i].str(), " is listed twice in ",
               devices_str(devices));
}

// A tensor of the input category (what a data loader would hand over).
Tensor input_zeros(const Shape& shape, DType dtype, Device d) {
  MemoryCategoryGuard tag(MemoryCategory::input);
  return zeros(shape, {.dtype = dtype, .device = d});
}

}  // namespace

SplitSpec SplitSpec::parse(const std::string& s) {
  if (s == "attention-mlp") return {Kind::attention_mlp, 0};
  if (s == "balanced") return {Kind::balanced, 0};
  if (s == "tensor") return {Kind::tensor, 0};
  if (s.rfind("stages:", 0) == 0) {
    int64_t k = 0;
    const std::string num = s.substr(7);
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), k);
    MG_CHECK(ec == std::errc() && p == num.data() + num.size() && k >= 1, "--split '", s,
             "': the number of stages after 'stages:' must be a positive integer");
    return {Kind::stages, k};
  }
  MG_THROW("--split '", s, "': unknown strategy (known: attention-mlp, stages:K, balanced, tensor)");
}

std::string SplitSpec::str() const {
  switch (kind) {
    case Kind::attention_mlp: return "attention-mlp";
    case Kind::stages: return "stages:" + std::to_string(stages);
    case Kind::balanced: return "balanced";
    case Kind::tensor: return "tensor";
  }
  return "?";
}

std::vector<Device> parse_devices(const std::string& s) {
  std::vector<Device> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    MG_CHECK(!item.empty(), "--devices '", s, "': empty device name (expected e.g. cpu:0,cpu:1)");
    out.emplace_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  check_devices(out);
  return out;
}

std::unique_ptr<Optimizer> default_optimizer(Module& model) {
  return std::make_unique<AdamW>(weight_decay_groups(model.named_parameters(), 3e-4, 0.01));
}

StepProbe gpt_step_probe(const GPTConfig& cfg, int64_t batch, int64_t seq,
                         std::function<std::unique_ptr<Optimizer>(Module&)> optimizer) {
  StepProbe p;
  p.build = [cfg](Device d) {
    Generator gen(0);  // not the default generator: measuring must not move the user's streams
    return std::static_pointer_cast<Module>(std::make_shared<GPT>(cfg, InitOptions{.gen = &gen, .device = d}));
  };
  p.loss = [batch, seq](Module& m) {
    auto& gpt = dynamic_cast<GPT&>(m);
    const Device d = gpt.wte->weight.device();  // tokens and targets where the embedding (and head) live
    return gpt.loss(input_zeros({batch, seq}, DType::i64, d), input_zeros({batch, seq}, DType::i64, d));
  };
  p.optimizer = std::move(optimizer);
  return p;
}

StepProbe mobilenet_step_probe(const MobileNetV2Config& cfg, int64_t batch, int64_t size,
                               std::function<std::unique_ptr<Optimizer>(Module&)> optimizer) {
  StepProbe p;
  p.build = [cfg](Device d) {
    Generator gen(0);
    return std::static_pointer_cast<Module>(std::make_shared<MobileNetV2>(cfg, InitOptions{.gen = &gen, .device = d}));
  };
  p.loss = [cfg, batch, size](Module& m) {
    auto& net = dynamic_cast<MobileNetV2&>(m);
    const Device d = (*net.features)[0]->parameters().front().device();  // the stem's
    Tensor logits = net(input_zeros({batch, cfg.in_channels, size, size}, DType::f32, d));
    return cross_entropy(logits, input_zeros({batch}, DType::i64, logits.device()));  // labels where the logits are
  };
  p.optimizer = std::move(optimizer);
  return p;
}

std::vector<int64_t> equal_counts(int64_t blocks, int64_t parts) {
  MG_CHECK(parts >= 1 && parts <= blocks, "model parallelism: cannot cut ", blocks, " blocks into ", parts,
           " non-empty stages");
  std::vector<int64_t> c(static_cast<size_t>(parts), blocks / parts);
  for (int64_t i = 0; i < blocks % parts; ++i) c[size_t(i)] += 1;
  return c;
}

Placement attention_mlp_placement(const ModelLayout& layout, const std::vector<Device>& devices) {
  check_devices(devices);
  MG_CHECK(layout.model == "GPT", "--split attention-mlp: only a GPT has attention and feed-forward sublayers (this is a ",
           layout.model, "; use stages:K or balanced)");
  MG_CHECK(devices.size() == 2, "--split attention-mlp needs exactly 2 devices (attention, feed-forward), got ",
           devices.size(), " (", devices_str(devices), ")");
  Placement p;
  for (const auto& m : layout.first) p.entries.emplace_back(m, devices[0]);
  for (const auto& b : layout.blocks) {
    p.entries.emplace_back(b + ".ln_1", devices[0]);
    p.entries.emplace_back(b + ".attn", devices[0]);
    p.entries.emplace_back(b + ".ln_2", devices[1]);
    p.entries.emplace_back(b + ".mlp", devices[1]);
  }
  for (const auto& m : layout.last) p.entries.emplace_back(m, devices[1]);
  return p;
}

Placement stages_placement(const ModelLayout& layout, const std::vector<Device>& devices,
                           const std::vector<int64_t>& counts) {
  check_devices(devices);
  MG_CHECK(counts.size() == devices.size(), "stages_placement: ", counts.size(), " block counts for ", devices.size(),
           " devices");
  int64_t total = 0;
  for (int64_t c : counts) {
    MG_CHECK(c >= 1, "stages_placement: every device needs at least one block, got counts with ", c);
    total += c;
  }
  MG_CHECK(total == int64_t(layout.blocks.size()), "stages_placement: the counts add up to ", total, " blocks but the ",
           layout.model, " has ", layout.blocks.size());
  Placement p;
  for (const auto& m : layout.first) p.entries.emplace_back(m, devices.front());
  size_t b = 0;
  for (size_t k = 0; k < devices.size(); ++k)
    for (int64_t j = 0; j < counts[k]; ++j) p.entries.emplace_back(layout.blocks[b++], devices[k]);
  for (const auto& m : layout.last) p.entries.emplace_back(m, devices.back());
  return p;
}

std::vector<int64_t> pipeline_stage_blocks(const ResolvedPlacement& r) {
  MG_CHECK(!r.layout.blocks.empty(), "pipeline: the ", r.layout.model, " has no blocks to cut into stages");
  std::vector<int64_t> counts;
  std::optional<Device> last;
  for (const std::string& block : r.layout.blocks) {
    std::optional<Device> dev;
    for (const auto& [leaf, d] : r.leaves) {
      if (!path_within(leaf, block)) continue;
      MG_CHECK(!dev || *dev == d, "pipeline: block ", block, " lies on ", dev->str(), " and ", d.str(),
               "; a pipeline stage holds whole blocks (use --split stages:K or balanced)");
      dev = d;
    }
    MG_INTERNAL_ASSERT(dev.has_value(), "pipeline: block ", block, " has no placed modules");
    if (!last || *last != *dev) counts.push_back(0);
    counts.back() += 1;
    last = dev;
  }
  return counts;
}

std::vector<DevicePeak> measure_on_meta(const StepProbe& probe, const Placement& placement) {
  const std::vector<Device> devices = placement.devices();
  MG_CHECK(devices.size() < size_t(kMaxDevicesPerType), "measure_on_meta: at most ", kMaxDevicesPerType - 1,
           " devices, got ", devices.size());
  std::vector<Device> metas;
  for (size_t i = 0; i < devices.size(); ++i) metas.emplace_back(DeviceType::meta, int(i + 1));
  Placement on_meta = placement;
  for (auto& [_, d] : on_meta.entries)
    d = metas[size_t(std::find(devices.begin(), devices.end(), d) - devices.begin())];

  Generator& gen = default_generator();  // dropout on meta still reserves stream positions
  const uint64_t offset = gen.offset();
  // A block reused from the cache may be larger than asked (when the rest is too small to split
  // off), so a peak depends on what the pool cached before: every measurement starts empty.
  for (const Device& m : metas) empty_cache(m);
  std::vector<DevicePeak> peaks;
  {
    std::shared_ptr<Module> model = probe.build(kMeta);
    const ResolvedPlacement r = apply_placement(*model, on_meta);
    std::unique_ptr<Optimizer> opt = probe.optimizer(*model);
    for (int step = 0; step < 2; ++step) {  // the second step has the optimizer state from the start
      if (step == 1)
        for (const Device& m : metas) reset_peak_stats(m);
      Tensor loss = probe.loss(*model);
      backward(loss);
      loss = Tensor();
      opt->step();
      opt->zero_grad();
    }
    peaks = device_peaks(metas);
    for (size_t i = 0; i < peaks.size(); ++i) {
      peaks[i].modules = r.modules_on(metas[i]);
      peaks[i].device = devices[i];
    }
  }
  gen.set_offset(offset);
  return peaks;
}

std::string BalancedPlan::str() const {
  std::string out = "balanced split over " + std::to_string(counts.size()) + " devices, blocks";
  for (size_t i = 0; i < counts.size(); ++i) out += (i ? " + " : " ") + std::to_string(counts[i]);
  out += " (" + std::to_string(evaluations) + " candidates measured on meta" +
         (budgets.empty() ? "" : "; peaks balanced as fractions of each device's budget") + ")\n";
  char line[256];
  for (size_t i = 0; i < predicted.size(); ++i) {
    const DevicePeak& p = predicted[i];
    std::snprintf(line, sizeof line, "  %-8s predicted peak %12s  (parameter %s, gradient %s, optimizer state %s, activation %s)",
                  p.device.str().c_str(), format_bytes(p.peak).c_str(), format_bytes(p.of(MemoryCategory::parameter)).c_str(),
                  format_bytes(p.of(MemoryCategory::gradient)).c_str(),
                  format_bytes(p.of(MemoryCategory::optimizer_state)).c_str(),
                  format_bytes(p.of(MemoryCategory::activation)).c_str());
    out += line;
    if (i < budgets.size()) {
      std::snprintf(line, sizeof line, ", %.0f%% of %s", 100.0 * double(p.peak) / double(budgets[i]),
                    format_bytes(budgets[i]).c_str());
      out += line;
    }
    out += ": " + p.modules + "\n";
  }
  return out;
}

BalancedPlan plan_balanced(const StepProbe& probe, const std::vector<Device>& devices,
                           const std::vector<int64_t>& budgets) {
  check_devices(devices);
  MG_CHECK(budgets.empty() || budgets.size() == devices.size(), "--split balanced: ", budgets.size(),
           " budgets for ", devices.size(), " devices");
  for (int64_t b : budgets) MG_CHECK(b > 0, "--split balanced: a device's budget must be positive, got ", b);
  ModelLayout layout;
  {
    Generator& gen = default_generator();
    const uint64_t offset = gen.offset();
    std::shared_ptr<Module> m = probe.build(kMeta);
    layout = model_layout(*m);
    gen.set_offset(offset);
  }
  const int64_t L = int64_t(layout.blocks.size()), K = int64_t(devices.size());
  std::map<std::vector<int64_t>, std::vector<DevicePeak>> measured;
  auto peaks_of = [&](const std::vector<int64_t>& c) -> const std::vector<DevicePeak>& {
    auto it = measured.find(c);
    if (it == measured.end()) it = measured.emplace(c, measure_on_meta(probe, stages_placement(layout, devices, c))).first;
    return it->second;
  };
  // The load to lower: the largest peak, in bytes or as a fraction of its device's budget.
  auto largest = [&](const std::vector<DevicePeak>& p) {
    double m = 0;
    for (size_t i = 0; i < p.size(); ++i)
      m = std::max(m, budgets.empty() ? double(p[i].peak) : double(p[i].peak) / double(budgets[i]));
    return m;
  };
  std::vector<int64_t> best = equal_counts(L, K);
  double best_peak = largest(peaks_of(best));
  while (true) {  // move one block across one cut, the best such move, while it helps
    std::vector<int64_t> next;
    double next_peak = best_peak;
    for (size_t i = 0; i + 1 < best.size(); ++i) {
      for (int64_t dir : {+1, -1}) {
        std::vector<int64_t> c = best;
        c[i] -= dir;
        c[i + 1] += dir;
        if (c[i] < 1 || c[i + 1] < 1) continue;
        const double p = largest(peaks_of(c));
        if (p < next_peak) {
          next_peak = p;
          next = c;
        }
      }
    }
    if (next.empty()) break;
    best = next;
    best_peak = next_peak;
  }
  return {stages_placement(layout, devices, best), best, peaks_of(best), budgets, int64_t(measured.size())};
}

Placement split_placement(const SplitSpec& spec, Module& model, const std::vector<Device>& devices,
                          const StepProbe* probe, BalancedPlan* plan, const std::vector<int64_t>& budgets) {
  check_devices(devices);
  // A device that is not there fails here, before balanced spends its meta runs (a mix of cpu:N
  // and cuda:N is fine: each module computes on its device, to() carries the residual stream).
  for (const Device& d : devices) {
    std::string why;
    MG_CHECK(device_exists(d, why), "model parallelism: device ", d.str(), " in ", devices_str(devices),
             " does not exist: ", why, "\n  hint: memgrad info lists the devices; cpu:N always exists");
  }
  const ModelLayout layout = model_layout(model);
  const int64_t L = int64_t(layout.blocks.size()), K = int64_t(devices.size());
  switch (spec.kind) {
    case SplitSpec::Kind::attention_mlp:
      return attention_mlp_placement(layout, devices);
    case SplitSpec::Kind::stages:
      MG_CHECK(spec.stages == K, "--split ", spec.str(), " needs ", spec.stages, " devices, got ", K, " (",
               devices_str(devices), ")");
      MG_CHECK(K <= L, "--split ", spec.str(), ": the ", layout.model, " has only ", L, " blocks");
      return stages_placement(layout, devices, equal_counts(L, K));
    case SplitSpec::Kind::balanced: {
      MG_CHECK(probe != nullptr, "--split balanced: no training step to measure on meta (pass a StepProbe)");
      MG_CHECK(K <= L, "--split balanced over ", K, " devices: the ", layout.model, " has only ", L, " blocks");
      BalancedPlan p = plan_balanced(*probe, devices, budgets);
      MG_CHECK(p.counts.size() == size_t(K), "--split balanced: the probe's model does not match this one");
      Placement out = p.placement;
      if (plan) *plan = std::move(p);
      return out;
    }
    case SplitSpec::Kind::tensor:
      MG_CHECK(layout.model == "GPT", "--split tensor slices a GPT's attention heads and MLP over the devices (this is a ",
               layout.model, "; use stages:K or balanced)");
      MG_THROW("split_placement: --split tensor is not a placement; apply it with apply_tensor_parallel");
  }
  MG_THROW("split_placement: unknown strategy");
}

}  // namespace mg
