// The memory profiler: while active it records every allocation and free on the devices it
// watches (through the caching allocator's observer hook) with category, op, module path and
// step phase, computes the peak and what was alive then, and writes memory.json (Chrome
// trace-event format, read back by `memgrad report`) and memory.html (core/memory_profile_html.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/memory_category.h"
#include "core/tensor.h"

namespace mg {

struct ProfileEvent {
  MemoryEvent::Kind kind;
  Device device;
  uint64_t block_id;
  int64_t bytes;  // rounded block size
  MemoryCategory category;
  const char* op;      // string literal ("" outside any op)
  uint32_t module;     // index into MemoryProfiler::modules()
  StepPhase phase;
  double t_us;              // microseconds since start()
  int64_t allocated_after;  // device's allocated bytes after the event (allocator's count)
  int64_t requested = 0;    // the tensor's own bytes (alloc events)
};

struct LiveTensor {
  uint64_t block_id = 0;
  int64_t bytes = 0;      // the allocator's block (rounded)
  int64_t requested = 0;  // the tensor's own bytes
  MemoryCategory category = MemoryCategory::other;
  std::string op;
  // "" at top level; for blocks that predate start() the name given with name_tensors (e.g.
  // "h.0.attn.c_attn.weight", "h.0.attn.c_attn.weight.exp_avg"), else "(before profiling)".
  std::string module;
  StepPhase phase = StepPhase::none;
};

struct DeviceMemoryProfile {
  Device device;
  int64_t start_bytes = 0;  // allocated when profiling started
  int64_t peak_bytes = 0;   // highest allocated while profiling (equals the allocator's peak)
  double peak_t_us = 0;
  StepPhase peak_phase = StepPhase::none;
  int64_t peak_event = -1;  // index in events() of the peak; -1 = the peak is the start
  std::array<int64_t, kNumMemoryCategories> at_peak{};        // bytes per category at the peak
  std::array<int64_t, kNumMemoryCategories> category_peak{};  // each category's own peak
  std::vector<LiveTensor> live_at_peak;                        // largest first
  int64_t num_events = 0;
};

struct MemoryProfileSummary {
  std::vector<DeviceMemoryProfile> devices;
  const DeviceMemoryProfile& device(Device d) const;  // throws when d was not watched
};

class MemoryProfiler : public AllocatorObserver {
 public:
  explicit MemoryProfiler(std::vector<Device> devices);
  ~MemoryProfiler() override;
  MemoryProfiler(const MemoryProfiler&) = delete;
  MemoryProfiler& operator=(const MemoryProfiler&) = delete;

  // Names the blocks of tensors that exist before start() (parameters, optimizer state), so the
  // report shows "h.0.mlp.c_fc.weight" instead of "(before profiling)". The first name wins.
  void name_tensors(const std::vector<std::pair<std::string, Tensor>>& named);
  // start() clears earlier events, snapshots the live blocks and begins recording.
  void start();
  void stop();
  bool active() const { return active_; }

  const std::vector<ProfileEvent>& events() const { return events_; }
  const std::vector<std::string>& modules() const { return modules_; }
  const std::vector<Device>& devices() const { return devices_; }
  MemoryProfileSummary summary() const;

  // Writes memory.json and memory.html into dir (created if missing); call after stop().
  void write(const std::string& dir) const;
  std::string trace_json() const;  // memory.json's text
  std::string html() const;        // memory.html's text

  void on_event(const MemoryEvent& e) override;

  // Bytes per category over time, one point per event (the start point first), for writers.
  struct Point {
    double t_us;
    std::array<int64_t, kNumMemoryCategories> bytes;
    StepPhase phase;
  };
  std::vector<Point> timeline(Device d) const;

  // The step phases while recording, from the phase changes themselves (StepPhaseGuard): one
  // span per change, none-phase spans left out, the last one ending at stop().
  struct PhaseSpan {
    StepPhase phase;
    double begin_us, end_us;
  };
  std::vector<PhaseSpan> phase_spans() const;
  // The phases as device d saw them. Note [Phases per device]: when every phase change came from
  // one thread these are phase_spans(); when several threads changed phases (a pipeline's
  // workers, a thread per stage, each in its own forward or backward) one global strip would
  // interleave them, so d's spans are the runs of equal phase among d's own events instead.
  std::vector<PhaseSpan> phase_spans(Device d) const;

 private:
  static void on_phase(void* self, StepPhase now);
  std::vector<Device> devices_;
  bool active_ = false;
  int64_t t0_ns_ = 0;
  mutable std::mutex mu_;
  std::vector<ProfileEvent> events_;
  std::vector<std::string> modules_;
  std::unordered_map<std::string, uint32_t> module_index_;
  std::unordered_map<uint64_t, std::string> tensor_names_;  // block id -> name (name_tensors)
  std::vector<std::vector<LiveBlockInfo>> start_blocks_;  // per watched device
  std::vector<int64_t> start_allocated_;
  double stop_t_us_ = 0;
  std::vector<std::pair<double, StepPhase>> phase_marks_;  // (t_us, phase from then on)
  std::thread::id phase_thread_{};   // the thread of the first phase change
  bool phases_from_many_threads_ = false;
  int device_slot(Device d) const;  // -1 when not watched
};

// memory.html for a profile (core/memory_profile_html.cpp).
std::string memory_profile_html(const MemoryProfiler& p, const MemoryProfileSummary& s);

}  // namespace mg
