// The caching allocator: one design for every device (cpu:N, meta, cuda:N). It holds segments
// obtained from a backend (mmap on the host, nothing at all on meta, cudaMalloc on a GPU) and
// serves blocks from them with PyTorch's rules (Note [Caching allocator rules] in
// caching_allocator.cpp). It keeps statistics per category, enforces a per-device budget with
// an OutOfMemoryError that explains itself, and tells observers (the profiler) every event.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/memory_category.h"

namespace mg {

// Where segments come from. One instance per device.
class BackendAllocator {
 public:
  virtual ~BackendAllocator() = default;
  // Returns nullptr when the backend itself is out of memory.
  virtual void* allocate_segment(size_t bytes) = 0;
  virtual void free_segment(void* ptr, size_t bytes) = 0;
  // Bytes the backend can hold at most (e.g. a GPU's memory); 0 when unknown.
  virtual size_t capacity() const { return 0; }
};

struct Segment;

// A piece of a segment, live (allocated) or cached (free for reuse).
struct MemoryBlock {
  char* ptr = nullptr;
  size_t size = 0;       // rounded size this block occupies
  size_t requested = 0;  // bytes the caller asked for (valid while allocated)
  Segment* segment = nullptr;
  MemoryBlock* prev = nullptr;  // neighbours inside the segment (for split / coalesce)
  MemoryBlock* next = nullptr;
  bool allocated = false;
  MemoryCategory category = MemoryCategory::other;
  const char* op = "";
  uint64_t id = 0;  // increasing allocation id, for the profiler
};

struct StatCounter {
  int64_t current = 0;
  int64_t peak = 0;
  void add(int64_t d) {
    current += d;
    if (current > peak) peak = current;
  }
};

struct MemoryStats {
  StatCounter allocated;  // bytes in live blocks (rounded sizes)
  StatCounter requested;  // bytes callers asked for
  StatCounter reserved;   // bytes held from the backend (live + cached)
  std::array<StatCounter, kNumMemoryCategories> allocated_by_category{};
  // Each category's bytes at the moment `allocated` reached its peak: they sum to allocated.peak
  // (each category's own peak, in allocated_by_category, may come at another moment).
  std::array<int64_t, kNumMemoryCategories> by_category_at_peak{};
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_segment_allocs = 0;  // backend calls
  int64_t num_segment_frees = 0;
  int64_t num_ooms = 0;
  size_t limit = 0;  // 0 = no limit

  const StatCounter& category(MemoryCategory c) const { return allocated_by_category[size_t(c)]; }
};

// One allocation or free, as observers see it.
struct MemoryEvent {
  enum class Kind : uint8_t { alloc, free };
  Kind kind;
  Device device;
  uint64_t block_id;
  size_t bytes;  // rounded block size
  MemoryCategory category;
  const char* op;
  int64_t allocated_after;  // device's allocated bytes after the event
  size_t requested = 0;     // the bytes the tensor asked for (alloc events)
};

class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual void on_event(const MemoryEvent& e) = 0;
};

struct LiveBlockInfo {
  size_t bytes;      // the block's rounded size
  MemoryCategory category;
  const char* op;
  uint64_t id;
  size_t requested;  // the bytes the tensor asked for
};

class CachingAllocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<BackendAllocator> backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Tags the block with the thread's current category and op. Throws OutOfMemoryError.
  MemoryBlock* allocate(size_t bytes);
  void free(MemoryBlock* b);
  // Returns every cached (unused) segment to the backend.
  void empty_cache();

  MemoryStats stats() const;
  void reset_peak_stats();
  void set_limit(size_t bytes);  // 0 removes the limit; a limit releases the cached free segments
  size_t limit() const;
  // The n largest live blocks, largest first.
  std::vector<LiveBlockInfo> largest_live_blocks(size_t n) const;
  Device device() const { return device_; }

 private:
  struct Impl;
  Device device_;
  std::unique_ptr<Impl> impl_;
};

// The allocator of a device (created on first use). cpu:N and meta always exist; cuda:N
// exists once the CUDA backend registered itself (see register_backend).
CachingAllocator& allocator_for(Device d);

using BackendFactory = std::unique_ptr<BackendAllocator> (*)(int index);
// Called by a backend's explicit init function (never a static initializer).
void register_backend(DeviceType type, BackendFactory factory);
bool backend_available(DeviceType type);

// Convenience wrappers over allocator_for(d).
void set_memory_limit(Device d, size_t bytes);
size_t memory_limit(Device d);
MemoryStats memory_stats(Device d);
void reset_peak_stats(Device d);
void empty_cache(Device d);
// The devices whose allocator exists, in a stable order.
std::vector<Device> active_devices();

// Observers see events of every device. Not owned; remove before destroying.
void add_allocator_observer(AllocatorObserver* o);
void remove_allocator_observer(AllocatorObserver* o);

// "1.50 MiB", "512 B"; parse_bytes accepts "512MiB", "2GB", "1.5GiB", "1000".
std::string format_bytes(int64_t bytes);
size_t parse_bytes(const std::string& s);

// A summary table of a device's statistics (used by `memgrad info`, apps and examples).
std::string memory_summary(Device d);

}  // namespace mg
