// The planner's rate for a data-parallel row's collectives, measured on the job's own ranks:
// `mpirun -np N memgrad plan ...` times an all-reduce, a reduce-scatter, an all-gather and a
// broadcast of one gradient bucket (--bucket-mb) on the N ranks before rank 0 plans, and caches
// the rates (collectives-<N>ranks.json beside the calibration, with the CPU and the bucket size)
// so a later plan in one process uses them for rows of N ranks. Each rate is the bytes one rank
// sends in a ring (Note [Collective time] in apps/plan.cpp) per second of the collective, so a
// row's collective time is its traffic's ring bytes at these rates.
#pragma once
#include <optional>
#include <string>

#include "parallel/process_group.h"

namespace mg {

// The bytes one rank of `ranks` sends in a ring for each kind of collective in `t`: an all-reduce
// of n bytes 2 (N - 1) / N n, a reduce-scatter of n or an all-gather into n (N - 1) / N n, a
// broadcast n.
ProcessGroup::Traffic ring_bytes_sent(const ProcessGroup::Traffic& t, int ranks);

struct CollectiveRates {
  int ranks = 0;
  double bucket_mb = 0.0;
  // Ring bytes sent per second, GB/s, by kind.
  double all_reduce_gbps = 0.0, reduce_scatter_gbps = 0.0, all_gather_gbps = 0.0, broadcast_gbps = 0.0;
  std::string path{};  // the cache file ("" when none)

  // Every rank of `group` (a real one, 2+ ranks) calls it: each collective on a bucket of f32
  // host tensors, a warm-up then the median of `reps` timings, each timing the mean of the ranks'.
  // The same rates come back on every rank.
  static CollectiveRates measure(ProcessGroup& group, double bucket_mb, int reps = 5);
  // The rates cached for `ranks` ranks and this bucket size on this CPU; none when missing,
  // unreadable, or measured for another CPU or bucket.
  static std::optional<CollectiveRates> cached(int ranks, double bucket_mb);
  void save();  // atomically; a failure to write leaves path empty

  // The time `t` (one rank's traffic) takes at these rates.
  double ms(const ProcessGroup::Traffic& t) const;
  // "all-reduce 1.20, reduce-scatter 1.10, all-gather 1.30, broadcast 2.00 GB/s at 2 ranks, 25 MiB buckets"
  std::string str() const;
};

}  // namespace mg
