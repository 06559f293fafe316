// Storage: a block from the device's caching allocator, plus the host copy primitive.
#include "core/storage.h"

#include <cstring>

#include "core/cuda/backend.h"
#include "core/error.h"

namespace mg {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (nbytes > 0) block_ = allocator_for(device).allocate(nbytes);
}

Storage::~Storage() {
  if (block_) allocator_for(device_).free(block_);
}

void* Storage::data() const {
  MG_CHECK(!device_.is_meta(), "tensor on meta has no data: meta holds shapes and bytes only "
           "(move it to a real device, or only ask for its shape)");
  return block_ ? block_->ptr : nullptr;
}

namespace {
CopyBytesFn g_cuda_copy = nullptr;
}

void register_device_copy(DeviceType type, CopyBytesFn fn) {
  MG_INTERNAL_ASSERT(type == DeviceType::cuda, "only the CUDA backend registers a copy function");
  g_cuda_copy = fn;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n) {
  if (n == 0) return;
  if (dst_device.is_meta() || src_device.is_meta()) {
    MG_CHECK(dst_device.is_meta(), "cannot copy from meta to ", dst_device.str(),
             ": meta tensors have no data");
    return;  // copying into meta moves no data
  }
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
  if (g_cuda_copy == nullptr) cuda::init_backend();  // registers the copy (no-op without CUDA)
  MG_CHECK(g_cuda_copy != nullptr, "no CUDA device: cannot copy between ", src_device.str(), " and ",
           dst_device.str(), " in a build without the CUDA backend");
  g_cuda_copy(dst, dst_device, src, src_device, n);
}

}  // namespace mg
