// The cuda:N device model where it can be tested anywhere: without a GPU (or without the CUDA
// backend) every way of reaching cuda:N is a clear "no CUDA device" mg::Error, never a crash;
// with a GPU (MG_TEST_DEVICE=cuda runs, scripts/gpu-check) the allocator statistics, budgets,
// categories and host <-> device copies behave as on cpu:N.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "core/allocator.h"
#include "core/cuda/backend.h"
#include "core/tensor.h"
#include "ops/ops.h"

using namespace mg;
using Catch::Matchers::Contains;

namespace {

bool have_gpu() { return cuda::device_count() > 0; }

}  // namespace

TEST_CASE("cuda device: the backend is built exactly when MG_WITH_CUDA is defined", "[cuda_device]") {
#ifdef MG_WITH_CUDA
  CHECK(cuda::is_built());
  CHECK(backend_available(DeviceType::cuda));
#else
  CHECK_FALSE(cuda::is_built());
  CHECK_FALSE(backend_available(DeviceType::cuda));
  CHECK(cuda::device_count() == 0);
#endif
  CHECK(Device("cuda:3").str() == "cuda:3");  // parsing never touches the backend
  if (cuda::device_count() == 0) CHECK_FALSE(cuda::device_count_error().empty());
}

TEST_CASE("cuda device: without a GPU, cuda:0 is a 'no CUDA device' error, not a crash", "[cuda_device]") {
  if (have_gpu()) {
    WARN("skipped: a GPU is present (" << cuda::device_description(0) << "); the no-GPU path is tested elsewhere");
    return;
  }
  Tensor x = ones({2, 3});
  CHECK_THROWS_WITH(empty({2, 3}, {.device = "cuda:0"}), Contains("no CUDA device") && Contains("cuda:0"));
  CHECK_THROWS_WITH(zeros({4}, {.device = "cuda:1"}), Contains("no CUDA device"));
  CHECK_THROWS_WITH(mg::to(x, Device("cuda:0")), Contains("no CUDA device"));
  CHECK_THROWS_WITH(memory_stats(Device("cuda:0")), Contains("no CUDA device"));
  CHECK_THROWS_WITH(set_memory_limit(Device("cuda:0"), 1 << 20), Contains("no CUDA device"));
  CHECK_THROWS_WITH(cuda::check_device(0), Contains("no CUDA device: cuda:0 was requested"));
  CHECK_THROWS_WITH(from_vector(std::vector<double>{1, 2}, {2}, {.device = "cuda:0"}), Contains("no CUDA device"));
#ifdef MG_WITH_CUDA
  // The runtime's own reason is part of the message.
  CHECK_THROWS_WITH(cuda::check_device(0), Contains("cudaGetDeviceCount"));
#endif
  // Nothing half-made stays behind: cpu keeps working and lists no cuda allocator.
  CHECK(sum(x).item() == 6.0);
  for (const Device& d : active_devices()) CHECK_FALSE(d.is_cuda());
}

TEST_CASE("cuda device: an index past the last GPU names how many there are", "[cuda_device]") {
  if (!have_gpu()) {
    WARN("skipped: no CUDA device (" << cuda::device_count_error() << ")");
    return;
  }
  const int n = cuda::device_count();
  if (n >= kMaxDevicesPerType) return;
  Device past(DeviceType::cuda, n);
  CHECK_THROWS_WITH(empty({2}, {.device = past}), Contains("no CUDA device") && Contains("this machine has"));
}

TEST_CASE("cuda device: allocator statistics, categories and budgets as on cpu", "[cuda_device]") {
  if (!have_gpu()) {
    WARN("skipped: no CUDA device (" << cuda::device_count_error() << ")");
    return;
  }
  const Device d("cuda:0");
  empty_cache(d);
  reset_peak_stats(d);
  const int64_t before = memory_stats(d).allocated.current;
  {
    MemoryCategoryGuard cat(MemoryCategory::parameter);
    Tensor p = zeros({1000}, {.device = d});  // 4000 B, rounded to 4096
    MemoryStats s = memory_stats(d);
    CHECK(s.allocated.current - before == 4096);
    CHECK(s.category(MemoryCategory::parameter).current >= 4096);
    CHECK(s.reserved.current >= s.allocated.current);
  }
  CHECK(memory_stats(d).allocated.current == before);
  // A budget turns an allocation past it into a catchable OutOfMemoryError. It counts reserved
  // bytes, so the cache is emptied first and the budget set 8 MiB above what stays reserved.
  empty_cache(d);
  set_memory_limit(d, size_t(memory_stats(d).reserved.current) + (size_t(8) << 20));
  CHECK_THROWS_AS(empty({int64_t(16) << 20}, {.dtype = DType::u8, .device = d}), OutOfMemoryError);
  Tensor ok = empty({int64_t(1) << 20}, {.dtype = DType::u8, .device = d});
  CHECK(ok.numel() == (int64_t(1) << 20));
  set_memory_limit(d, 0);
  CHECK_THAT(memory_summary(d), Contains("cuda:0"));
}

TEST_CASE("cuda device: copies between host and GPU keep every bit, strided ones too", "[cuda_device]") {
  if (!have_gpu()) {
    WARN("skipped: no CUDA device (" << cuda::device_count_error() << ")");
    return;
  }
  const Device d("cuda:0");
  std::vector<double> v(60);
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i) * 0.37 + 0.5;  // in range for every dtype
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    INFO("dtype " << dt);
    Tensor h = from_vector(v, {3, 4, 5}, {.dtype = dt});
    Tensor g = mg::to(h, d);
    CHECK(g.device() == d);
    CHECK(g.to_double_vector() == h.to_double_vector());
    // A transposed view goes through the strided copy on either side.
    Tensor ht = transpose(h, 0, 2), gt = transpose(g, 0, 2);
    CHECK(gt.to_double_vector() == ht.to_double_vector());
    CHECK(mg::to(gt, kCPU).to_double_vector() == ht.to_double_vector());
    CHECK(contiguous(gt).to_double_vector() == contiguous(ht).to_double_vector());
  }
  // Casting on the GPU rounds exactly as the CPU (the shared convert_scalar).
  Tensor h = from_vector(v, {60}, {.dtype = DType::f64});
  for (DType dt : {DType::f16, DType::bf16, DType::i32, DType::b8}) {
    INFO("cast to " << dt);
    CHECK(cast(mg::to(h, d), dt).to_double_vector() == cast(h, dt).to_double_vector());
  }
  Tensor f = full({7}, 2.5, {.device = d});
  CHECK(f.to_vector<double>() == std::vector<double>(7, 2.5));
  CHECK_THROWS_WITH(f.item_double(), Contains("exactly one"));
  CHECK(sum(f).item_double() == 17.5);
}

TEST_CASE("cuda device: to() between two GPUs (peer or staged through host)", "[cuda_device]") {
  if (cuda::device_count() < 2) {
    WARN("skipped: fewer than 2 CUDA devices (" << cuda::device_count() << ")");
    return;
  }
  std::vector<double> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i % 97) - 40.25;
  Tensor a = from_vector(v, {10, 100}, {.device = "cuda:0"});
  Tensor b = mg::to(transpose(a, 0, 1), Device("cuda:1"));
  CHECK(b.device() == Device("cuda:1"));
  CHECK(b.to_double_vector() == transpose(from_vector(v, {10, 100}), 0, 1).to_double_vector());
  CHECK(mg::to(b, Device("cuda:0")).to_double_vector() == b.to_double_vector());
}
