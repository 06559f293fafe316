// The memory profiler's recording, summary (peak, category peaks, tensors alive at the peak)
// and memory.json writer (Chrome trace-event format: one counter track per category and device,
// complete events for step phases, and a "memgrad" object with the summary for `memgrad report`).
#include "core/memory_profiler.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mg {
namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
const char* kBeforeProfiling = "(before profiling)";
}  // namespace

const DeviceMemoryProfile& MemoryProfileSummary::device(Device d) const {
  for (const auto& p : devices)
    if (p.device == d) return p;
  MG_CHECK(false, "the memory profile has no device ", d.str());
  return devices.front();
}

MemoryProfiler::MemoryProfiler(std::vector<Device> devices) : devices_(std::move(devices)) {
  MG_CHECK(!devices_.empty(), "MemoryProfiler needs at least one device to watch");
}

MemoryProfiler::~MemoryProfiler() { stop(); }

void MemoryProfiler::on_phase(void* self, StepPhase now) {
  auto* p = static_cast<MemoryProfiler*>(self);
  std::lock_guard<std::mutex> lk(p->mu_);
  p->phase_marks_.push_back({double(now_ns() - p->t0_ns_) / 1000.0, now});
  if (p->phase_thread_ == std::thread::id()) p->phase_thread_ = std::this_thread::get_id();
  else if (p->phase_thread_ != std::this_thread::get_id()) p->phases_from_many_threads_ = true;
}

std::vector<MemoryProfiler::PhaseSpan> MemoryProfiler::phase_spans(Device d) const {
  std::unique_lock<std::mutex> lk(mu_);
  if (!phases_from_many_threads_) {
    lk.unlock();
    return phase_spans();
  }
  std::vector<PhaseSpan> out;  // Note [Phases per device]
  const double end = active_ ? double(now_ns() - t0_ns_) / 1000.0 : stop_t_us_;
  for (const ProfileEvent& e : events_) {
    if (!(e.device == d)) continue;
    if (!out.empty() && out.back().phase == e.phase) continue;  // the span goes on
    if (!out.empty()) out.back().end_us = e.t_us;
    out.push_back({e.phase, e.t_us, end});
  }
  std::erase_if(out, [](const PhaseSpan& s) { return s.phase == StepPhase::none || !(s.end_us > s.begin_us); });
  return out;
}

std::vector<MemoryProfiler::PhaseSpan> MemoryProfiler::phase_spans() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<PhaseSpan> out;
  const double end = active_ ? double(now_ns() - t0_ns_) / 1000.0 : stop_t_us_;
  for (size_t i = 0; i < phase_marks_.size(); ++i) {
    const double b = phase_marks_[i].first, e = i + 1 < phase_marks_.size() ? phase_marks_[i + 1].first : end;
    if (phase_marks_[i].second != StepPhase::none && e > b) out.push_back({phase_marks_[i].second, b, e});
  }
  return out;
}

int MemoryProfiler::device_slot(Device d) const {
  for (size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i] == d) return int(i);
  return -1;
}

void MemoryProfiler::name_tensors(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [name, t] : named)
    if (t.defined() && t.storage()) tensor_names_.emplace(t.storage()->block_id(), name);
}

void MemoryProfiler::start() {
  MG_CHECK(!active_, "MemoryProfiler::start called twice without stop");
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.clear();
    modules_.clear();
    module_index_.clear();
    modules_.push_back("");
    module_index_[""] = 0;
    start_blocks_.clear();
    start_allocated_.clear();
    for (Device d : devices_) {
      CachingAllocator& a = allocator_for(d);
      start_blocks_.push_back(a.largest_live_blocks(std::numeric_limits<size_t>::max()));
      start_allocated_.push_back(a.stats().allocated.current);
    }
    t0_ns_ = now_ns();
    phase_marks_.assign(1, {0.0, current_step_phase()});
    phase_thread_ = std::thread::id();
    phases_from_many_threads_ = false;
  }
  add_allocator_observer(this);
  set_step_phase_listener(&MemoryProfiler::on_phase, this);
  active_ = true;
}

void MemoryProfiler::stop() {
  if (!active_) return;
  remove_allocator_observer(this);
  set_step_phase_listener(nullptr, nullptr);
  active_ = false;
  std::lock_guard<std::mutex> lk(mu_);
  stop_t_us_ = double(now_ns() - t0_ns_) / 1000.0;
}

void MemoryProfiler::on_event(const MemoryEvent& e) {
  if (device_slot(e.device) < 0) return;
  const std::string& path = current_module_path();
  std::lock_guard<std::mutex> lk(mu_);
  auto it = module_index_.find(path);
  uint32_t m;
  if (it == module_index_.end()) {
    m = uint32_t(modules_.size());
    modules_.push_back(path);
    module_index_.emplace(path, m);
  } else {
    m = it->second;
  }
  events_.push_back({e.kind, e.device, e.block_id, int64_t(e.bytes), e.category, e.op ? e.op : "", m,
                     current_step_phase(), double(now_ns() - t0_ns_) / 1000.0, e.allocated_after,
                     int64_t(e.requested)});
}

std::vector<MemoryProfiler::Point> MemoryProfiler::timeline(Device d) const {
  int slot = device_slot(d);
  MG_CHECK(slot >= 0, "the memory profiler does not watch ", d.str());
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Point> out;
  Point p{0.0, {}, StepPhase::none};
  for (const LiveBlockInfo& b : start_blocks_[size_t(slot)]) p.bytes[size_t(b.category)] += int64_t(b.bytes);
  out.push_back(p);
  for (const ProfileEvent& e : events_) {
    if (!(e.device == d)) continue;
    p.t_us = e.t_us;
    p.phase = e.phase;
    p.bytes[size_t(e.category)] += e.kind == MemoryEvent::Kind::alloc ? e.bytes : -e.bytes;
    out.push_back(p);
  }
  return out;
}

MemoryProfileSummary MemoryProfiler::summary() const {
  std::lock_guard<std::mutex> lk(mu_);
  MemoryProfileSummary s;
  for (size_t slot = 0; slot < devices_.size(); ++slot) {
    const Device d = devices_[slot];
    DeviceMemoryProfile p;
    p.device = d;
    p.start_bytes = start_allocated_.empty() ? 0 : start_allocated_[slot];
    p.peak_bytes = p.start_bytes;
    std::array<int64_t, kNumMemoryCategories> cur{};
    if (!start_blocks_.empty())
      for (const LiveBlockInfo& b : start_blocks_[slot]) cur[size_t(b.category)] += int64_t(b.bytes);
    p.at_peak = cur;
    p.category_peak = cur;
    for (size_t i = 0; i < events_.size(); ++i) {
      const ProfileEvent& e = events_[i];
      if (!(e.device == d)) continue;
      ++p.num_events;
      cur[size_t(e.category)] += e.kind == MemoryEvent::Kind::alloc ? e.bytes : -e.bytes;
      p.category_peak[size_t(e.category)] = std::max(p.category_peak[size_t(e.category)], cur[size_t(e.category)]);
      if (e.allocated_after > p.peak_bytes) {
        p.peak_bytes = e.allocated_after;
        p.peak_event = int64_t(i);
        p.peak_t_us = e.t_us;
        p.peak_phase = e.phase;
        p.at_peak = cur;
      }
    }
    // The live set at the peak: the start blocks plus everything allocated up to the peak event
    // and not freed by then.
    std::unordered_map<uint64_t, LiveTensor> live;
    if (!start_blocks_.empty())
      for (const LiveBlockInfo& b : start_blocks_[slot])
        live[b.id] = {b.id, int64_t(b.bytes), int64_t(b.requested), b.category, b.op ? b.op : "",
                      tensor_names_.count(b.id) ? tensor_names_.at(b.id) : kBeforeProfiling, StepPhase::none};
    for (int64_t i = 0; i <= p.peak_event; ++i) {
      const ProfileEvent& e = events_[size_t(i)];
      if (!(e.device == d)) continue;
      if (e.kind == MemoryEvent::Kind::alloc)
        live[e.block_id] = {e.block_id, e.bytes, e.requested, e.category, e.op, modules_[e.module], e.phase};
      else
        live.erase(e.block_id);
    }
    for (auto& [id, t] : live) p.live_at_peak.push_back(std::move(t));
    std::sort(p.live_at_peak.begin(), p.live_at_peak.end(), [](const LiveTensor& a, const LiveTensor& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.block_id < b.block_id;
    });
    s.devices.push_back(std::move(p));
  }
  return s;
}

namespace {
nlohmann::json summary_json(const MemoryProfileSummary& s) {
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& p : s.devices) {
    nlohmann::json at_peak, cat_peak, live = nlohmann::json::array();
    for (MemoryCategory c : kAllMemoryCategories) {
      at_peak[std::string(category_name(c))] = p.at_peak[size_t(c)];
      cat_peak[std::string(category_name(c))] = p.category_peak[size_t(c)];
    }
    for (const LiveTensor& t : p.live_at_peak)
      live.push_back({{"id", t.block_id}, {"bytes", t.bytes}, {"requested", t.requested},
                      {"category", category_name(t.category)},
                      {"op", t.op}, {"module", t.module}, {"phase", step_phase_name(t.phase)}});
    devs.push_back({{"device", p.device.str()}, {"start_bytes", p.start_bytes}, {"peak_bytes", p.peak_bytes},
                    {"peak_time_us", p.peak_t_us}, {"peak_phase", step_phase_name(p.peak_phase)},
                    {"num_events", p.num_events}, {"at_peak", at_peak}, {"category_peak", cat_peak},
                    {"live_at_peak", live}});
  }
  return {{"format", "memgrad-memory-profile"}, {"version", 1}, {"devices", devs}};
}
}  // namespace

std::string MemoryProfiler::trace_json() const {
  MemoryProfileSummary s = summary();
  nlohmann::json ev = nlohmann::json::array();
  for (size_t slot = 0; slot < devices_.size(); ++slot) {
    const Device d = devices_[slot];
    const int pid = int(slot) + 1;
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                  {"args", {{"name", "memory " + d.str()}}}});
    std::vector<Point> tl = timeline(d);
    // Counter tracks: one per category ("name" is the track, args hold the value in bytes).
    for (size_t i = 0; i < tl.size(); ++i) {
      if (i > 0 && i + 1 < tl.size() && tl[i].t_us == tl[i + 1].t_us) continue;  // same timestamp: last wins
      for (MemoryCategory c : kAllMemoryCategories)
        ev.push_back({{"name", std::string(category_name(c))}, {"ph", "C"}, {"pid", pid}, {"tid", 0},
                      {"ts", tl[i].t_us}, {"args", {{"bytes", tl[i].bytes[size_t(c)]}}}});
    }
    // Step phases as complete events ("X"), from the recorded phase changes (per device under
    // pipeline workers: Note [Phases per device]).
    for (const PhaseSpan& sp : phase_spans(d))
      ev.push_back({{"name", std::string(step_phase_name(sp.phase))}, {"cat", "phase"}, {"ph", "X"}, {"pid", pid},
                    {"tid", 1}, {"ts", sp.begin_us}, {"dur", sp.end_us - sp.begin_us}});
    const DeviceMemoryProfile& p = s.devices[slot];
    ev.push_back({{"name", "peak " + format_bytes(p.peak_bytes)}, {"ph", "i"}, {"s", "p"}, {"pid", pid},
                  {"tid", 0}, {"ts", p.peak_t_us},
                  {"args", {{"bytes", p.peak_bytes}, {"phase", step_phase_name(p.peak_phase)}}}});
  }
  nlohmann::json root = {{"traceEvents", ev}, {"displayTimeUnit", "ms"}, {"memgrad", summary_json(s)}};
  return root.dump();
}

std::string MemoryProfiler::html() const { return memory_profile_html(*this, summary()); }

void MemoryProfiler::write(const std::string& dir) const {
  MG_CHECK(!active_, "MemoryProfiler::write called while profiling; call stop() first");
  std::filesystem::create_directories(dir);
  auto put = [&](const std::string& name, const std::string& text) {
    std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream f(path, std::ios::binary);
    MG_CHECK(f, "cannot write ", path);
    f << text;
    MG_CHECK(f.good(), "error writing ", path);
  };
  put("memory.json", trace_json());
  put("memory.html", html());
}

}  // namespace mg
