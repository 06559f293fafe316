// The caching allocator (see allocator.h), one instance per device.
//
// Note [Caching allocator rules] (after PyTorch's CUDACachingAllocator)
// - Every request is rounded up to a multiple of 512 bytes (at least 512).
// - Requests up to 1 MiB come from the small pool, whose segments are 2 MiB; larger ones from
//   the large pool, whose segments are 20 MiB for requests under 10 MiB and the request rounded
//   up to 2 MiB otherwise. Under a tight budget a segment shrinks to what the request needs.
// - A request takes the smallest cached block of its pool that fits (best fit). If the block is
//   larger, it is split when the rest is worth keeping (>= 512 B small, > 1 MiB large).
// - A freed block merges with free neighbours of its segment, so a freed large tensor can be
//   reused whole: no fragmentation from splitting.
// - When a new segment would pass the budget (or the backend is out), every fully free segment
//   goes back to the backend and the allocation is retried once; then OutOfMemoryError.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/allocator.h"
#include "core/fault_injection.h"
#include "core/cuda/backend.h"
#include "core/error.h"

namespace mg {

struct Segment {
  char* ptr;
  size_t size;
  bool small_pool;
  MemoryBlock* first;  // blocks in address order via next
  uint64_t seq = 0;    // creation order in its allocator (Note [Backend-independent best fit])
};

namespace {

constexpr size_t kRound = 512;
constexpr size_t kSmallRequest = 1 << 20;      // 1 MiB
constexpr size_t kSmallSegment = 2 << 20;      // 2 MiB
constexpr size_t kMinLargeSplit = 1 << 20;     // split large blocks if > 1 MiB remains
constexpr size_t kMidRequest = 10 << 20;       // 10 MiB
constexpr size_t kLargeSegment = 20 << 20;     // 20 MiB
constexpr size_t kLargeRound = 2 << 20;        // 2 MiB

size_t round_size(size_t n) { return n < kRound ? kRound : (n + kRound - 1) / kRound * kRound; }

// Note [Backend-independent best fit]: among free blocks of one size the choice must not depend
// on the addresses a backend hands out (mmap's go down, meta's counter goes up), or meta would
// pick other blocks than cpu:N and their peaks would part. Ties go to the oldest segment, then to
// the lower offset inside it.
struct BlockLess {
  bool operator()(const MemoryBlock* a, const MemoryBlock* b) const {
    if (a->size != b->size) return a->size < b->size;
    if (a->segment->seq != b->segment->seq) return a->segment->seq < b->segment->seq;
    return a->ptr < b->ptr;
  }
};

// Host memory straight from the kernel: untouched pages cost no resident memory, and
// munmap returns freed segments to the OS, so reserved bytes track the process's RSS.
class HostBackend : public BackendAllocator {
 public:
  void* allocate_segment(size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void free_segment(void* ptr, size_t bytes) override { munmap(ptr, bytes); }
};

// Meta: addresses from a counter, no memory at all.
class MetaBackend : public BackendAllocator {
 public:
  void* allocate_segment(size_t bytes) override {
    uintptr_t p = next_;
    next_ += (bytes + 4095) / 4096 * 4096 + 4096;
    return reinterpret_cast<void*>(p);
  }
  void free_segment(void*, size_t) override {}

 private:
  uintptr_t next_ = uintptr_t(1) << 40;
};

std::mutex g_observers_mu;
std::vector<AllocatorObserver*> g_observers;
std::atomic<bool> g_has_observers{false};

void notify(const MemoryEvent& e) {
  if (!g_has_observers.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lk(g_observers_mu);
  for (AllocatorObserver* o : g_observers) o->on_event(e);
}

// Note [Out-of-memory hints]: only techniques memgrad has, each with the `memgrad gpt|vision
// train` flag that turns it on (apps/technique_flags.h), chosen by the category that holds the
// most memory. tests/core/test_allocator.cpp checks each category's hint.
std::string techniques_hint(const MemoryStats& s) {
  MemoryCategory top = MemoryCategory::other;
  int64_t best = -1;
  for (MemoryCategory c : kAllMemoryCategories)
    if (s.category(c).current > best) best = s.category(c).current, top = c;
  switch (top) {
    case MemoryCategory::activation:
      return "activations dominate: try --checkpoint blocks (or every:K, sqrt, selective), a smaller "
             "--micro-batch N (or --auto-fit to find one), --precision bf16 (or fp16) autocast, or "
             "--offload-activations cpu:1 (saved activations wait on another device until backward)";
    case MemoryCategory::parameter:
      return "parameters dominate: try --precision bf16-pure (bf16 parameters and gradients)";
    case MemoryCategory::optimizer_state:
      return "optimizer state dominates: try --optimizer sgd (plain SGD keeps no state per parameter)";
    case MemoryCategory::gradient:
      return "gradients dominate: try --precision bf16-pure (bf16 parameters and gradients)";
    case MemoryCategory::input:
      return "input batches dominate: try a smaller --batch";
    default:
      return "try a smaller --batch, a smaller --micro-batch N (or --auto-fit), --checkpoint blocks or "
             "--precision bf16";
  }
}

}  // namespace

struct CachingAllocator::Impl {
  Device device;
  std::unique_ptr<BackendAllocator> backend;
  mutable std::mutex mu;
  std::set<MemoryBlock*, BlockLess> small_free, large_free;
  std::vector<Segment*> segments;
  uint64_t segment_seq = 0;  // segments made so far (Note [Backend-independent best fit])
  MemoryStats stats;
  uint64_t next_id = 1;

  std::set<MemoryBlock*, BlockLess>& pool(bool small) { return small ? small_free : large_free; }

  ~Impl() {
    for (Segment* s : segments) {
      for (MemoryBlock* b = s->first; b;) {
        MemoryBlock* n = b->next;
        delete b;
        b = n;
      }
      backend->free_segment(s->ptr, s->size);
      delete s;
    }
  }

  MemoryBlock* find_free(size_t size, bool small) {
    auto& p = pool(small);
    Segment before_all{};  // seq 0: sorts ahead of every real segment of this size
    MemoryBlock key;
    key.size = size;
    key.ptr = nullptr;
    key.segment = &before_all;
    auto it = p.lower_bound(&key);
    if (it == p.end()) return nullptr;
    MemoryBlock* b = *it;
    p.erase(it);
    return b;
  }

  Segment* new_segment(size_t size, bool small) {
    void* p = backend->allocate_segment(size);
    if (!p) return nullptr;
    auto* seg = new Segment{static_cast<char*>(p), size, small, nullptr, ++segment_seq};
    auto* b = new MemoryBlock;
    b->ptr = seg->ptr;
    b->size = size;
    b->segment = seg;
    seg->first = b;
    segments.push_back(seg);
    stats.reserved.add(int64_t(size));
    ++stats.num_segment_allocs;
    return seg;
  }

  bool fits_limit(size_t size) const {
    return stats.limit == 0 || size_t(stats.reserved.current) + size <= stats.limit;
  }

  // A new segment able to hold `size`; nullptr when the budget or the backend says no.
  Segment* grow(size_t size, bool small) {
    size_t seg = small ? kSmallSegment
                       : (size < kMidRequest ? kLargeSegment
                                             : (size + kLargeRound - 1) / kLargeRound * kLargeRound);
    if (!fits_limit(seg)) seg = size;  // under a tight budget take only what is needed
    if (!fits_limit(seg)) return nullptr;
    return new_segment(seg, small);
  }

  void release_free_segments() {
    std::vector<Segment*> keep;
    for (Segment* s : segments) {
      MemoryBlock* b = s->first;
      if (!b->allocated && b->next == nullptr) {
        pool(s->small_pool).erase(b);
        delete b;
        backend->free_segment(s->ptr, s->size);
        stats.reserved.add(-int64_t(s->size));
        ++stats.num_segment_frees;
        delete s;
      } else {
        keep.push_back(s);
      }
    }
    segments.swap(keep);
  }

  void split(MemoryBlock* b, size_t size, bool small) {
    size_t rest = b->size - size;
    if (small ? rest < kRound : rest <= kMinLargeSplit) return;
    auto* r = new MemoryBlock;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->segment = b->segment;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool(small).insert(r);
  }

  std::vector<LiveBlockInfo> largest(size_t n) const {
    std::vector<LiveBlockInfo> v;
    for (Segment* s : segments)
      for (MemoryBlock* b = s->first; b; b = b->next)
        if (b->allocated) v.push_back({b->size, b->category, b->op, b->id, b->requested});
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.bytes > b.bytes; });
    if (v.size() > n) v.resize(n);
    return v;
  }

  [[noreturn]] void throw_oom(size_t requested, size_t rounded, bool injected = false) {
    ++stats.num_ooms;
    std::ostringstream os;
    if (injected) os << "(injected fault, core/fault_injection.h) ";
    os << "out of memory on " << device.str() << ": tried to allocate " << format_bytes(int64_t(rounded))
       << " (requested " << requested << " B";
    if (*current_op_name()) os << " by op '" << current_op_name() << "'";
    os << ", category " << category_name(current_memory_category()) << ")\n";
    os << "  allocated " << format_bytes(stats.allocated.current) << ", reserved "
       << format_bytes(stats.reserved.current) << " (cached "
       << format_bytes(stats.reserved.current - stats.allocated.current) << "), limit "
       << (stats.limit ? format_bytes(int64_t(stats.limit)) : std::string("none"));
    if (backend->capacity()) os << ", device capacity " << format_bytes(int64_t(backend->capacity()));
    os << "\n  allocated by category:";
    for (MemoryCategory c : kAllMemoryCategories)
      if (stats.category(c).current) os << " " << category_name(c) << " " << format_bytes(stats.category(c).current) << ";";
    auto big = largest(5);
    if (!big.empty()) {
      os << "\n  largest live tensors:";
      for (auto& b : big)
        os << "\n    " << format_bytes(int64_t(b.bytes)) << " " << category_name(b.category) << " from op '"
           << (*b.op ? b.op : "(none)") << "'";
    }
    os << "\n  hint: " << techniques_hint(stats);
    throw OutOfMemoryError(os.str());
  }
};

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<BackendAllocator> backend)
    : device_(device), impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->backend = std::move(backend);
}

CachingAllocator::~CachingAllocator() = default;

MemoryBlock* CachingAllocator::allocate(size_t bytes) {
  Impl& m = *impl_;
  size_t size = round_size(bytes);
  bool small = size <= kSmallRequest;
  MemoryBlock* b;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    if (fault_now(FaultSite::allocation)) [[unlikely]]
      m.throw_oom(bytes, size, /*injected=*/true);
    b = m.find_free(size, small);
    if (!b) {
      Segment* seg = m.grow(size, small);
      if (!seg) {
        m.release_free_segments();
        seg = m.grow(size, small);
      }
      if (!seg) m.throw_oom(bytes, size);
      b = seg->first;
    }
    m.split(b, size, small);
    b->allocated = true;
    b->requested = bytes;
    b->category = current_memory_category();
    b->op = current_op_name();
    b->id = m.next_id++;
    m.stats.allocated.add(int64_t(b->size));
    m.stats.requested.add(int64_t(bytes));
    m.stats.allocated_by_category[size_t(b->category)].add(int64_t(b->size));
    if (m.stats.allocated.current == m.stats.allocated.peak)  // a new peak: remember its make-up
      for (size_t c = 0; c < kNumMemoryCategories; ++c)
        m.stats.by_category_at_peak[c] = m.stats.allocated_by_category[c].current;
    ++m.stats.num_allocs;
  }
  if (g_has_observers.load(std::memory_order_relaxed))
    notify({MemoryEvent::Kind::alloc, device_, b->id, b->size, b->category, b->op,
            m.stats.allocated.current, b->requested});
  return b;
}

void CachingAllocator::free(MemoryBlock* b) {
  Impl& m = *impl_;
  MemoryEvent ev{MemoryEvent::Kind::free, device_, b->id, b->size, b->category, b->op, 0};
  {
    std::lock_guard<std::mutex> lk(m.mu);
    MG_INTERNAL_ASSERT(b->allocated, "double free of a block");
    m.stats.allocated.add(-int64_t(b->size));
    m.stats.requested.add(-int64_t(b->requested));
    m.stats.allocated_by_category[size_t(b->category)].add(-int64_t(b->size));
    ++m.stats.num_frees;
    b->allocated = false;
    bool small = b->segment->small_pool;
    auto& pool = m.pool(small);
    // Coalesce with free neighbours.
    if (b->prev && !b->prev->allocated) {
      MemoryBlock* p = b->prev;
      pool.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      delete b;
      b = p;
    }
    if (b->next && !b->next->allocated) {
      MemoryBlock* n = b->next;
      pool.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      delete n;
    }
    pool.insert(b);
    ev.allocated_after = m.stats.allocated.current;
  }
  if (g_has_observers.load(std::memory_order_relaxed)) notify(ev);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->release_free_segments();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto& s = impl_->stats;
  s.allocated.peak = s.allocated.current;
  s.requested.peak = s.requested.current;
  s.reserved.peak = s.reserved.current;
  for (auto& c : s.allocated_by_category) c.peak = c.current;
  for (size_t c = 0; c < kNumMemoryCategories; ++c) s.by_category_at_peak[c] = s.allocated_by_category[c].current;
}

void CachingAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->stats.limit = bytes;
  // Cached free segments would otherwise serve requests past the new budget: a budget counts
  // from what is live, not from what an earlier job left cached.
  if (bytes != 0) impl_->release_free_segments();
}

size_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats.limit;
}

std::vector<LiveBlockInfo> CachingAllocator::largest_live_blocks(size_t n) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->largest(n);
}

// ---- registry -------------------------------------------------------------------------------

namespace {
std::mutex g_registry_mu;
std::map<std::pair<int, int>, std::unique_ptr<CachingAllocator>> g_allocators;
BackendFactory g_factories[3] = {nullptr, nullptr, nullptr};
}  // namespace

void register_backend(DeviceType type, BackendFactory factory) {
  std::lock_guard<std::mutex> lk(g_registry_mu);
  g_factories[int(type)] = factory;
}

bool backend_available(DeviceType type) {
  if (type != DeviceType::cuda) return true;
  cuda::init_backend();  // Note [Backend registration]: registers itself on first use (no-op without CUDA)
  std::lock_guard<std::mutex> lk(g_registry_mu);
  return g_factories[int(type)] != nullptr;
}

CachingAllocator& allocator_for(Device d) {
  if (d.type == DeviceType::cuda) cuda::init_backend();  // before the lock: it calls register_backend
  std::lock_guard<std::mutex> lk(g_registry_mu);
  auto key = std::make_pair(int(d.type), d.index);
  auto it = g_allocators.find(key);
  if (it != g_allocators.end()) return *it->second;
  std::unique_ptr<BackendAllocator> backend;
  if (d.type == DeviceType::cpu) backend = std::make_unique<HostBackend>();
  else if (d.type == DeviceType::meta) backend = std::make_unique<MetaBackend>();
  else {
    MG_CHECK(g_factories[int(d.type)] != nullptr, "no CUDA device: ", d.str(),
             " was requested but this memgrad was built without the CUDA backend (or it was not "
             "initialised)");
    backend = g_factories[int(d.type)](d.index);  // throws "no CUDA device: ..." when absent
  }
  auto& slot = g_allocators[key];
  slot = std::make_unique<CachingAllocator>(d, std::move(backend));
  return *slot;
}

std::vector<Device> active_devices() {
  std::lock_guard<std::mutex> lk(g_registry_mu);
  std::vector<Device> v;
  for (auto& [k, a] : g_allocators) v.push_back(a->device());
  return v;
}

void set_memory_limit(Device d, size_t bytes) { allocator_for(d).set_limit(bytes); }
size_t memory_limit(Device d) { return allocator_for(d).limit(); }
MemoryStats memory_stats(Device d) { return allocator_for(d).stats(); }
void reset_peak_stats(Device d) { allocator_for(d).reset_peak_stats(); }
void empty_cache(Device d) { allocator_for(d).empty_cache(); }

void add_allocator_observer(AllocatorObserver* o) {
  std::lock_guard<std::mutex> lk(g_observers_mu);
  g_observers.push_back(o);
  g_has_observers = true;
}

void remove_allocator_observer(AllocatorObserver* o) {
  std::lock_guard<std::mutex> lk(g_observers_mu);
  g_observers.erase(std::remove(g_observers.begin(), g_observers.end(), o), g_observers.end());
  g_has_observers = !g_observers.empty();
}

// ---- formatting -----------------------------------------------------------------------------

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

size_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    MG_THROW("bad memory size '", s, "': expected a number with an optional unit, e.g. 512MiB");
  }
  std::string unit = s.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  MG_CHECK(mult > 0, "bad memory size '", s, "': unknown unit '", unit, "' (use B, KiB, MiB, GiB, KB, MB, GB)");
  MG_CHECK(v >= 0, "bad memory size '", s, "': must not be negative");
  // Past 2^63 bytes the conversion is undefined (found by tests/fuzz/fuzz_cli_strings.cpp).
  MG_CHECK(v * mult < 0x1p63, "bad memory size '", s, "': more than 8 EiB");
  return size_t(v * mult);
}

std::string memory_summary(Device d) {
  MemoryStats s = memory_stats(d);
  std::ostringstream os;
  os << d.str() << ": allocated " << format_bytes(s.allocated.current) << " (peak "
     << format_bytes(s.allocated.peak) << "), reserved " << format_bytes(s.reserved.current) << " (peak "
     << format_bytes(s.reserved.peak) << "), limit " << (s.limit ? format_bytes(int64_t(s.limit)) : "none")
     << "\n";
  for (MemoryCategory c : kAllMemoryCategories) {
    const auto& k = s.category(c);
    if (k.peak == 0) continue;
    char line[128];
    std::snprintf(line, sizeof line, "  %-16s current %12s  peak %12s\n", std::string(category_name(c)).c_str(),
                  format_bytes(k.current).c_str(), format_bytes(k.peak).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace mg
