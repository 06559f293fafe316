// parallel_for on OpenMP with thread-count-independent chunking.
#include "core/parallel.h"

#include <algorithm>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mg {

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(std::max(1, n));
#else
  (void)n;
#endif
}

bool in_parallel_region() {
#ifdef _OPENMP
  return omp_in_parallel();
#else
  return false;
#endif
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t n = end - begin;
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || num_threads() == 1 || in_parallel_region()) {
    for (int64_t c = 0; c < chunks; ++c) fn(begin + c * grain, std::min(end, begin + (c + 1) * grain));
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    try {
      fn(begin + c * grain, std::min(end, begin + (c + 1) * grain));
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace mg
