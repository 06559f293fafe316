// Storage: a block of device memory owned by one or more tensors (views share it). It returns
// its block to the caching allocator when the last tensor lets go, and carries the version
// counter that every in-place write bumps (so autograd can tell a saved tensor was modified).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace mg {

class Storage {
 public:
  // Allocates through allocator_for(device) with the thread's current category and op.
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Throws on meta (which has no data).
  void* data() const;
  // The address even on meta (never dereference it there): identity of the memory.
  void* address() const { return block_ ? block_->ptr : nullptr; }
  // The allocator's id of the block (0 without one): what the memory profiler names tensors by.
  uint64_t block_id() const { return block_ ? block_->id : 0; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemoryCategory category() const { return block_ ? block_->category : MemoryCategory::other; }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  MemoryBlock* block_ = nullptr;
  size_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
};

// Copies raw bytes between two devices' memory (host<->host now; the CUDA backend adds its own).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);

using CopyBytesFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                             size_t n);
// The CUDA backend registers the function that handles any copy involving a cuda device.
void register_device_copy(DeviceType type, CopyBytesFn fn);

}  // namespace mg
