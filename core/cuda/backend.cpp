// The CUDA backend's registration with core: the cudaMalloc segment source under the caching
// allocator (same rounding, pools, budgets and per-category statistics as cpu:N, see
// caching_allocator.cpp), and copy_bytes for host <-> GPU and GPU <-> GPU (peer copy when the
// two GPUs can reach each other, otherwise staged through a host block of cpu:0's allocator,
// so even the staging buffer is counted; the peer copy is ordered by events, Note [Copies between
// GPUs]). Asking for a GPU that is not there is an mg::Error.
#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/allocator.h"
#include "core/cuda/backend.h"
#include "core/cuda/context.h"
#include "core/storage.h"

namespace mg::cuda {
namespace {

struct DeviceCount {
  int count = 0;
  std::string error;  // why count is 0
};

const DeviceCount& probe() {
  static const DeviceCount dc = [] {
    DeviceCount r;
    cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      r.count = 0;
      r.error = ::mg::detail::str_cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    } else if (r.count == 0) {
      r.error = "no error, but 0 devices";
    }
    return r;
  }();
  return dc;
}

// Segments straight from cudaMalloc on one device.
class CudaBackend : public BackendAllocator {
 public:
  explicit CudaBackend(int index) : index_(index) {
    DeviceGuard g(index_);
    size_t free_b = 0, total_b = 0;
    MG_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    capacity_ = total_b;
  }

  void* allocate_segment(size_t bytes) override {
    DeviceGuard g(index_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it; the allocator frees its cache and retries
      return nullptr;
    }
    MG_CUDA_CHECK(e);
    return p;
  }

  // Never throws (called from destructors). At process exit the runtime may already be gone.
  void free_segment(void* ptr, size_t bytes) override {
    int prev = -1;
    (void)cudaGetDevice(&prev);
    if (prev != index_) (void)cudaSetDevice(index_);
    cudaError_t e = cudaFree(ptr);
    // At exit the runtime or the context may be gone already: the memory goes with them.
    if (e != cudaSuccess && e != cudaErrorCudartUnloading && e != cudaErrorContextIsDestroyed) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "memgrad: cudaFree of a %zu-byte segment on cuda:%d failed: %s\n", bytes, index_,
                   cudaGetErrorString(e));
    }
    if (prev >= 0 && prev != index_) (void)cudaSetDevice(prev);
  }

  size_t capacity() const override { return capacity_; }

 private:
  int index_;
  size_t capacity_ = 0;
};

std::unique_ptr<BackendAllocator> make_backend(int index) {
  check_device(index);
  return std::make_unique<CudaBackend>(index);
}

void sync_stream(int device) {
  DeviceGuard g(device);
  MG_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
}

// Enables peer access from `from` to `to` once; false when the hardware cannot.
bool peer_access(int from, int to) {
  static std::mutex mu;
  static int state[kMaxDevicesPerType][kMaxDevicesPerType] = {};  // 0 unknown, 1 yes, -1 no
  std::lock_guard<std::mutex> lk(mu);
  int& s = state[from][to];
  if (s == 0) {
    int can = 0;
    MG_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
    s = can ? 1 : -1;
    if (can) {
      DeviceGuard g(from);
      cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else MG_CUDA_CHECK(e);
    }
  }
  return s == 1;
}

// Staged GPU -> host -> GPU copy in bounded chunks of one cpu:0 block (tagged workspace).
void staged_copy(void* dst, int dst_dev, const void* src, int src_dev, size_t n) {
  constexpr size_t kChunk = size_t(64) << 20;
  size_t chunk = std::min(n, kChunk);
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  CachingAllocator& host = allocator_for(kCPU);
  MemoryBlock* block = host.allocate(chunk);
  try {
    for (size_t off = 0; off < n; off += chunk) {
      size_t len = std::min(chunk, n - off);
      {
        DeviceGuard g(src_dev);
        MG_CUDA_CHECK(cudaMemcpyAsync(block->ptr, static_cast<const char*>(src) + off, len, cudaMemcpyDeviceToHost,
                                      stream(src_dev)));
        MG_CUDA_CHECK(cudaStreamSynchronize(stream(src_dev)));
      }
      DeviceGuard g(dst_dev);
      MG_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, block->ptr, len, cudaMemcpyHostToDevice,
                                    stream(dst_dev)));
      MG_CUDA_CHECK(cudaStreamSynchronize(stream(dst_dev)));
    }
  } catch (...) {
    host.free(block);
    throw;
  }
  host.free(block);
}

// Note [Copies between GPUs]: a direct copy from cuda:S to cuda:D, ordered by two events and
// no host wait (a pipeline stage hands its activation to the next GPU and goes on):
//   1. `ready` recorded on S's stream: the copy must not read the source before the kernels that
//      wrote it are done;
//   2. D's stream waits for `ready`, copies, and records `copied`: D's later kernels read the copy
//      in stream order, and the destination block (fresh from D's allocator) is only written
//      after its previous users on D's stream (Note [Streams and threads], context.cpp);
//   3. S's stream waits for `copied`: the source block may be freed the moment to() returns, and
//      S's allocator may hand it to the next kernel on S's stream, which must not overwrite it
//      while D still reads it.
// Destroying an event right after enqueueing a wait on it is allowed: the wait holds the record.
class OneEvent {  // an event of one device, destroyed there (also when a CUDA call throws)
 public:
  explicit OneEvent(int device) : device_(device) {
    DeviceGuard g(device_);
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~OneEvent() {
    int prev = -1;
    (void)cudaGetDevice(&prev);
    if (prev != device_) (void)cudaSetDevice(device_);
    (void)cudaEventDestroy(event_);
    if (prev >= 0 && prev != device_) (void)cudaSetDevice(prev);
  }
  OneEvent(const OneEvent&) = delete;
  OneEvent& operator=(const OneEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

void peer_copy(void* dst, int dst_dev, const void* src, int src_dev, size_t n) {
  cudaStream_t s_src = stream(src_dev), s_dst = stream(dst_dev);
  OneEvent ready(src_dev), copied(dst_dev);  // an event is recorded on a stream of its own device
  {
    DeviceGuard g(src_dev);
    MG_CUDA_CHECK(cudaEventRecord(ready.get(), s_src));
  }
  {
    DeviceGuard g(dst_dev);
    MG_CUDA_CHECK(cudaStreamWaitEvent(s_dst, ready.get(), 0));
    MG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, s_dst));
    MG_CUDA_CHECK(cudaEventRecord(copied.get(), s_dst));
  }
  DeviceGuard g(src_dev);
  MG_CUDA_CHECK(cudaStreamWaitEvent(s_src, copied.get(), 0));
}

// copy_bytes for every copy that involves a GPU. Copies that reach the host are synchronous (the
// host reads or reuses its buffer right after); a copy within one GPU is stream-ordered, one
// between GPUs event-ordered (Note [Copies between GPUs]) or staged through the host.
void copy_involving_cuda(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (dd.is_cuda() && sd.is_cpu()) {
    DeviceGuard g(dd.index);
    MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream(dd.index)));
    MG_CUDA_CHECK(cudaStreamSynchronize(stream(dd.index)));
  } else if (dd.is_cpu() && sd.is_cuda()) {
    DeviceGuard g(sd.index);
    MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream(sd.index)));
    MG_CUDA_CHECK(cudaStreamSynchronize(stream(sd.index)));
  } else if (dd.is_cuda() && sd.is_cuda() && dd.index == sd.index) {
    DeviceGuard g(dd.index);
    MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream(dd.index)));
  } else if (dd.is_cuda() && sd.is_cuda()) {
    if (peer_access(sd.index, dd.index) && peer_access(dd.index, sd.index)) {  // both ways: direct copy
      peer_copy(dst, dd.index, src, sd.index, n);
    } else {
      // Through the host: each half waits for its stream, so the source is complete and the
      // destination's earlier users are done; nothing is left in flight.
      sync_stream(dd.index);
      sync_stream(sd.index);
      staged_copy(dst, dd.index, src, sd.index, n);
    }
  } else {
    MG_THROW("copy_bytes: no copy from ", sd.str(), " to ", dd.str());
  }
}

std::atomic<bool> g_tf32{false};

}  // namespace

void init_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_backend(DeviceType::cuda, &make_backend);
    register_device_copy(DeviceType::cuda, &copy_involving_cuda);
  });
}

bool is_built() { return true; }
int device_count() { return probe().count; }
std::string device_count_error() { return probe().error; }

void check_device(int index) {
  const DeviceCount& dc = probe();
  MG_CHECK(dc.count > 0, "no CUDA device: cuda:", index, " was requested but no GPU is visible (cudaGetDeviceCount: ",
           dc.error, ")\n  hint: run on a machine with an NVIDIA GPU and driver, or use cpu:N");
  MG_CHECK(index >= 0 && index < dc.count, "no CUDA device: cuda:", index, " was requested but this machine has ",
           dc.count, " CUDA device", dc.count == 1 ? "" : "s", " (cuda:0 to cuda:", dc.count - 1,
           ")\n  hint: CUDA_VISIBLE_DEVICES limits which GPUs are visible");
}

std::string device_description(int index) {
  const cudaDeviceProp& p = properties(index);
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", double(p.totalGlobalMem) / double(1ull << 30));
  return ::mg::detail::str_cat(p.name, ", ", mem, ", compute capability ", p.major, ".", p.minor, ", ",
                               p.multiProcessorCount, " SMs");
}

void synchronize(Device d) {
  MG_CHECK(d.is_cuda(), "cuda::synchronize: ", d.str(), " is not a CUDA device");
  sync_stream(d.index);
}

void set_allow_tf32(bool allow) { g_tf32 = allow; }
bool allow_tf32() { return g_tf32; }

}  // namespace mg::cuda
