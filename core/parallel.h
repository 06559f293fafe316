// Threading: OpenMP-backed parallel_for over index ranges. Work is split into chunks whose
// boundaries depend only on the range and the grain, never on the thread count, so kernels
// that reduce per chunk give the same bits with 1 or 16 threads.
#pragma once
#include <cstdint>
#include <functional>

namespace mg {

int num_threads();
void set_num_threads(int n);
bool in_parallel_region();

// Calls fn(begin, end) on disjoint chunks of [begin, end), each at least `grain` long (except
// the last), possibly on several threads. Runs inline when the range is small or nested.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace mg
