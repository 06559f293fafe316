// The CUDA backend's plain C++ face (no CUDA headers, so core/ and ops/*.cpp may include it).
// Core calls init_backend() lazily the first time a cuda:N device is touched (allocator_for,
// backend_available, copy_bytes): the one explicit init call of Note [Backend registration].
// A build without CUDA links core/cuda_stub.cpp instead, where init_backend() does nothing.
#pragma once
#include <string>

#include "core/tensor.h"

namespace mg::cuda {

// Note [Backend registration]: registers the cuda:N allocator factory and the copy function for
// any copy involving a GPU with core (idempotent, thread-safe). No static initializers: the
// linker would drop them from a static library.
void init_backend();
bool is_built();  // true when this memgrad was compiled with the CUDA backend

// Visible GPUs: 0 when there is none, no driver, or no CUDA backend (never throws).
int device_count();
// Why device_count() is 0 ("" when it is not): cudaGetDeviceCount's error, or "built without CUDA".
std::string device_count_error();
// Throws mg::Error "no CUDA device: cuda:N was requested but ..." unless cuda:N exists.
void check_device(int index);
// "NVIDIA H200, 139.8 GiB, compute capability 9.0, 132 SMs" (for `memgrad info` and logs).
std::string device_description(int index);

// Waits for every kernel and copy queued on the device's stream.
void synchronize(Device d);

// f32 matmul on tensor cores in TF32 (10-bit mantissa): off unless asked, as in PyTorch.
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---- the core kernels (core/cuda/core_kernels.cu), called by core/tensor.cpp on cuda tensors ----
// t (any strides) = value.
void fill(const Tensor& t, double value);
// dst = src converted to dst's dtype; both on one cuda device, same shape, any strides.
void copy(const Tensor& dst, const Tensor& src);
// dst += src; same shape, dtype and device, any strides.
void accumulate(const Tensor& dst, const Tensor& src);

}  // namespace mg::cuda
