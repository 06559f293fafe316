// Latency of one allocate + free pair served from the caching allocator's cache (cpu:0), at a
// small-pool size (512 B), a mid small-pool size (64 KiB) and a large-pool size (4 MiB); the same
// through a tensor (mg::empty + destruction: TensorImpl, Storage and the block); and malloc/free
// for scale. The time column is nanoseconds per pair (one pair per iteration).
// Run: OMP_NUM_THREADS=2 build/release/bench/bench_allocator --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "core/allocator.h"
#include "core/tensor.h"

namespace {

void BM_CachingAllocatorPair(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  mg::CachingAllocator& alloc = mg::allocator_for(mg::kCPU);
  alloc.free(alloc.allocate(bytes));  // warm: the segment now sits in the cache
  const int64_t segments_before = alloc.stats().num_segment_allocs;
  for (auto _ : state) {
    mg::MemoryBlock* b = alloc.allocate(bytes);
    benchmark::DoNotOptimize(b->ptr);
    alloc.free(b);
  }
  // Every pair must have been a cache hit, or this measured the backend (mmap) instead.
  if (alloc.stats().num_segment_allocs != segments_before) state.SkipWithError("allocation missed the cache");
}

void BM_EmptyTensorPair(benchmark::State& state) {
  const int64_t numel = state.range(0) / int64_t(sizeof(float));
  { mg::Tensor warm = mg::empty({numel}); }
  for (auto _ : state) {
    mg::Tensor t = mg::empty({numel});
    benchmark::DoNotOptimize(t.data_ptr());
  }
}

// Reference: glibc malloc/free of the same size (4 MiB goes through mmap above its threshold
// until glibc raises the threshold adaptively).
void BM_MallocPair(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

}  // namespace

BENCHMARK(BM_CachingAllocatorPair)->Arg(512)->Arg(64 << 10)->Arg(4 << 20);
BENCHMARK(BM_EmptyTensorPair)->Arg(512)->Arg(64 << 10)->Arg(4 << 20);
BENCHMARK(BM_MallocPair)->Arg(512)->Arg(64 << 10)->Arg(4 << 20);

BENCHMARK_MAIN();
