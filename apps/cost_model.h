// The planner's time estimate: a step costs its FLOPs at this machine's measured rates plus the
// elements of the tensors it creates, as f32 bytes (each written once and read once; a 16-bit
// element costs an f32 one's: FlopCounts::elements), at the copy bandwidth of a working set as
// large as the tensor's reuse distance (Note [Reuse distance] in core/flop_counter.h): a
// temporary read by the next op streams from a cache, an activation saved for the backward pass
// of a large micro-batch from main memory. A training batch norm's further passes over its
// input are charged at their own rate (FlopKind::batch_norm). The rates are measured once per CPU
// model and thread count (an element-wise op over working sets of 256 KiB to 512 MiB; an f32 and
// a bf16 GEMM, a depthwise convolution, a pointwise convolution pair in f32 and in bf16 and a
// batch norm + ReLU6, each forward and backward, at their work over their time less their created
// tensors' charge; about a second) and cached as JSON under the user's cache folder ($MG_CACHE_DIR, else $XDG_CACHE_HOME/memgrad,
// else ~/.cache/memgrad).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/flop_counter.h"

namespace mg {

// An element-wise op's bandwidth (bytes read + written per second) when every byte is touched
// again after `working_set_bytes` of traffic: y = x * 1.5 over working_set_bytes / 2, repeated.
struct BandwidthPoint {
  double working_set_bytes = 0;
  double gbytes_per_s = 0;
};

// What a cache written by an older cost model lacks: such a cache is measured anew.
inline constexpr int kCalibrationVersion = 4;

struct Calibration {
  std::string cpu;          // lscpu's model name (/proc/cpuinfo)
  int threads = 0;          // OpenMP threads it was measured with
  std::string gemm{};       // cpu_gemm_backend() it was measured with (kernel, bf16 path)
  double gflops[kNumFlopKinds] = {};  // per FlopKind, GFLOP/s
  std::vector<BandwidthPoint> bandwidth{};  // ascending working sets
  std::string path{};       // where it is cached ("" if it could not be written)
  bool cached = false;      // read from the cache rather than measured now

  nlohmann::json to_json() const;
  // A calibration of this machine: the cached one when its CPU, thread count, GEMM paths and
  // kCalibrationVersion match, else measured now and written to the cache.
  static Calibration of_this_machine();
  // The copy bandwidth at this working set: interpolated between the measured points in
  // log(size), the end points' beyond them.
  double gbytes_per_s_at(double working_set_bytes) const;
  // Milliseconds for a step of these FLOPs and created elements (by their reuse distance).
  double estimate_ms(const FlopCounts& work) const;
  std::string str() const;  // "AMD EPYC, 2 threads: f32 GEMM 80.1 GFLOP/s, ..., element-wise GB/s by working set: 256K 40.2 ..."
};

// The cache file for this CPU and thread count.
std::string calibration_cache_path();
// The folder the planner caches its measurements in (see above), and lscpu's model name.
std::string memgrad_cache_dir();
std::string cpu_model_name();

}  // namespace mg
