// The CUDA backend's entry points in a build without CUDA (CMake builds this file or core/cuda/,
// never both): init_backend() registers nothing, so asking for cuda:N gives the "no CUDA device"
// error of allocator_for, and device_count() is 0. The core kernels (fill, copy, accumulate)
// throw, so core/tensor.cpp dispatches on is_cuda() without preprocessor branches.
#include "core/cuda/backend.h"

namespace mg::cuda {

void init_backend() {}
bool is_built() { return false; }
int device_count() { return 0; }
std::string device_count_error() { return "this memgrad was built without the CUDA backend"; }

void check_device(int index) {
  MG_THROW("no CUDA device: cuda:", index, " was requested but this memgrad was built without the CUDA backend",
           "\n  hint: configure with `cmake --preset cuda` on a machine with the CUDA toolkit");
}

std::string device_description(int index) { return "cuda:" + std::to_string(index) + " (no CUDA backend)"; }

void synchronize(Device) {}
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }

namespace {
[[noreturn]] void no_cuda(const char* op, const Tensor& t) {
  MG_THROW(op, ": tensor on ", t.device().str(), " but this memgrad was built without CUDA");
}
}  // namespace

void fill(const Tensor& t, double) { no_cuda("fill_", t); }
void copy(const Tensor& dst, const Tensor&) { no_cuda("copy_", dst); }
void accumulate(const Tensor& dst, const Tensor&) { no_cuda("accumulate_", dst); }

}  // namespace mg::cuda
