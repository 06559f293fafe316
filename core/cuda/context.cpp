// Per-device CUDA state (see context.h) and the error helpers of cuda_check.h. The states are
// created once and never destroyed: the CUDA runtime tears itself down at process exit, and a
// handle destroyed after that (from a static destructor) would crash instead of exiting cleanly.
//
// Note [Streams and threads]: every thread that touches cuda:N (the caller, and the pipeline's
// worker per stage, parallel/pipeline.h) enqueues on the one stream of cuda:N, so stages on
// different GPUs run on different streams and overlap, and stages that share a GPU interleave in
// the order their threads enqueue. That order is always a correct one: a tensor reaches another
// thread only after its producer was enqueued (a mailbox, a refcount), and the caching allocator
// hands a freed block out again only after the free, so the new user's kernels queue behind the
// old user's on that same stream. A second stream on one device would break that reuse rule
// (it would need PyTorch's per-block record_stream events), so there is none. What is per thread
// are the library handles: cuBLAS and cuDNN handles must not be used by two threads at once (and
// matmul sets its workspace on the handle per call), so each thread gets its own, bound to the
// device's stream, taken from a pool and given back when the thread ends (pipeline workers come
// and go each step). Copies between GPUs are ordered by events (backend.cpp, Note [Copies
// between GPUs]).
#include "core/cuda/context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/cuda/backend.h"
#include "core/device.h"
#include "core/error.h"
#include "core/memory_category.h"

namespace mg::cuda {
namespace {

struct DeviceState {
  std::once_flag stream_once, prop_once;
  cudaStream_t stream = nullptr;
  cudaDeviceProp prop{};
};

DeviceState& state(int device) {
  MG_INTERNAL_ASSERT(device >= 0 && device < kMaxDevicesPerType, "cuda device index ", device);
  static DeviceState* states = new DeviceState[kMaxDevicesPerType];  // never freed (see above)
  return states[device];
}

// "core/cuda/context.cpp" out of an absolute __FILE__.
const char* short_file(const char* file) {
  for (const char* root : {"/core/", "/ops/", "/bench/", "/tests/"}) {
    const char* p = std::strstr(file, root);
    if (p) return p + 1;
  }
  return file;
}

std::string where(const char* file, int line) {
  const char* op = current_op_name();
  return ::mg::detail::str_cat(op && *op ? " in " : "", op ? op : "", " at ", short_file(file), ":", line);
}

bool launch_blocking() {
  static const bool on = [] {
    const char* v = std::getenv("MG_CUDA_LAUNCH_BLOCKING");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

DeviceGuard::DeviceGuard(int index) {
  MG_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != index) MG_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_ && prev_ >= 0) (void)cudaSetDevice(prev_);
}

cudaStream_t stream(int device) {
  DeviceState& s = state(device);
  std::call_once(s.stream_once, [&] {
    check_device(device);
    DeviceGuard g(device);
    // Non-blocking: no implicit synchronisation with the legacy default stream.
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  });
  return s.stream;
}

// ---- library handles, one per thread and device (Note [Streams and threads]) ----------------

namespace {

// Handles of finished threads, ready for the next thread (never freed, see the top).
struct HandlePool {
  std::mutex mu;
  std::vector<cublasHandle_t> cublas[kMaxDevicesPerType];
  std::vector<cublasLtHandle_t> cublaslt[kMaxDevicesPerType];
#ifdef MG_WITH_CUDNN
  std::vector<cudnnHandle_t> cudnn[kMaxDevicesPerType];
#endif
};

HandlePool& pool() {
  static HandlePool* p = new HandlePool;
  return *p;
}

// Takes a handle of `device` from the pool, or makes one with `create` (under the device).
template <class H, class Create>
H take(std::vector<H> (&free)[kMaxDevicesPerType], int device, Create create) {
  {
    std::lock_guard<std::mutex> lk(pool().mu);
    std::vector<H>& v = free[device];
    if (!v.empty()) {
      H h = v.back();
      v.pop_back();
      return h;
    }
  }
  check_device(device);
  DeviceGuard g(device);
  return create();
}

// This thread's handles; its destructor (at thread exit) gives them back to the pool. It makes
// no CUDA call, so it is safe at process exit too.
struct ThreadHandles {
  cublasHandle_t cublas[kMaxDevicesPerType] = {};
  cublasLtHandle_t cublaslt[kMaxDevicesPerType] = {};
#ifdef MG_WITH_CUDNN
  cudnnHandle_t cudnn[kMaxDevicesPerType] = {};
#endif
  ~ThreadHandles() {
    std::lock_guard<std::mutex> lk(pool().mu);
    for (int d = 0; d < kMaxDevicesPerType; ++d) {
      if (cublas[d]) pool().cublas[d].push_back(cublas[d]);
      if (cublaslt[d]) pool().cublaslt[d].push_back(cublaslt[d]);
#ifdef MG_WITH_CUDNN
      if (cudnn[d]) pool().cudnn[d].push_back(cudnn[d]);
#endif
    }
  }
};

ThreadHandles& thread_handles(int device) {
  MG_INTERNAL_ASSERT(device >= 0 && device < kMaxDevicesPerType, "cuda device index ", device);
  thread_local ThreadHandles h;
  return h;
}

}  // namespace

cublasHandle_t cublas_handle(int device) {
  cublasHandle_t& h = thread_handles(device).cublas[device];
  if (!h) {
    cudaStream_t st = stream(device);
    h = take(pool().cublas, device, [&] {
      cublasHandle_t c = nullptr;
      MG_CUBLAS_CHECK(cublasCreate(&c));
      MG_CUBLAS_CHECK(cublasSetStream(c, st));
      // Pointer mode host: alpha/beta are host scalars. The workspace is set per call from the
      // caching allocator (ops/cuda/matmul.cu), so cuBLAS never cudaMallocs behind its back.
      MG_CUBLAS_CHECK(cublasSetPointerMode(c, CUBLAS_POINTER_MODE_HOST));
      return c;
    });
  }
  return h;
}

cublasLtHandle_t cublaslt_handle(int device) {
  cublasLtHandle_t& h = thread_handles(device).cublaslt[device];
  if (!h) {
    h = take(pool().cublaslt, device, [] {
      cublasLtHandle_t c = nullptr;
      MG_CUBLAS_CHECK(cublasLtCreate(&c));  // cuBLASLt takes the stream per call
      return c;
    });
  }
  return h;
}

#ifdef MG_WITH_CUDNN
cudnnHandle_t cudnn_handle(int device) {
  cudnnHandle_t& h = thread_handles(device).cudnn[device];
  if (!h) {
    cudaStream_t st = stream(device);
    h = take(pool().cudnn, device, [&] {
      cudnnHandle_t c = nullptr;
      MG_CUDNN_CHECK(cudnnCreate(&c));
      MG_CUDNN_CHECK(cudnnSetStream(c, st));
      return c;
    });
  }
  return h;
}
#endif

const cudaDeviceProp& properties(int device) {
  DeviceState& s = state(device);
  std::call_once(s.prop_once, [&] {
    check_device(device);
    MG_CUDA_CHECK(cudaGetDeviceProperties(&s.prop, device));
  });
  return s.prop;
}

unsigned grid_for(int device, int64_t n, int threads, int waves) {
  const cudaDeviceProp& p = properties(device);
  int64_t per_sm = std::max(1, p.maxThreadsPerMultiProcessor / threads);
  int64_t cap = int64_t(p.multiProcessorCount) * per_sm * waves;
  int64_t need = (n + threads - 1) / threads;
  int64_t blocks = std::min(cap, std::max<int64_t>(need, 1));
  return unsigned(std::min<int64_t>(blocks, 0x7fffffff));
}

// ---- error helpers -------------------------------------------------------------------------

namespace detail {

void throw_cuda(const char* stmt, const char* file, int line, cudaError_t e) {
  (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  std::string msg = ::mg::detail::str_cat("CUDA error", where(file, line), ": ", stmt, " failed: ",
                                          cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  if (e == cudaErrorMemoryAllocation)
    msg += "\n  hint: the GPU itself is full (memgrad's budget was not reached); empty_cache() or a smaller batch";
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    msg += "\n  hint: no usable GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES";
  throw Error(msg);
}

void throw_cublas(const char* stmt, const char* file, int line, cublasStatus_t s) {
  throw Error(::mg::detail::str_cat("cuBLAS error", where(file, line), ": ", stmt, " failed: ",
                                    cublasGetStatusName(s), " (", cublasGetStatusString(s), ")"));
}

#ifdef MG_WITH_CUDNN
void throw_cudnn(const char* stmt, const char* file, int line, cudnnStatus_t s) {
  char detail_msg[512] = {0};
  cudnnGetLastErrorString(detail_msg, sizeof detail_msg);
  throw Error(::mg::detail::str_cat("cuDNN error", where(file, line), ": ", stmt, " failed: ",
                                    cudnnGetErrorString(s), detail_msg[0] ? " (" : "", detail_msg,
                                    detail_msg[0] ? ")" : ""));
}
#endif

void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && launch_blocking()) {
    int dev = 0;
    MG_CUDA_CHECK(cudaGetDevice(&dev));
    e = cudaStreamSynchronize(stream(dev));
  }
  if (e != cudaSuccess) [[unlikely]]
    throw Error(::mg::detail::str_cat("CUDA kernel ", kernel, " failed", where(file, line), ": ",
                                      cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace detail
}  // namespace mg::cuda
