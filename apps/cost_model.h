// The planner's time estimate: a step costs its FLOPs at this machine's measured rates plus its
// allocated bytes at the measured memory bandwidth (each byte written once and read once). The
// rates are measured once per CPU model and thread count (an f32 and a bf16 GEMM, a depthwise
// convolution, a large copy; about a second) and cached as JSON under the user's cache folder
// ($MG_CACHE_DIR, else $XDG_CACHE_HOME/memgrad, else ~/.cache/memgrad).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/flop_counter.h"

namespace mg {

struct Calibration {
  std::string cpu;          // lscpu's model name (/proc/cpuinfo)
  int threads = 0;          // OpenMP threads it was measured with
  std::string gemm{};       // cpu_gemm_backend() it was measured with (kernel, bf16 path)
  double gflops[kNumFlopKinds] = {};  // per FlopKind, GFLOP/s
  double gbytes_per_s = 0;  // copy bandwidth (read + write)
  std::string path{};       // where it is cached ("" if it could not be written)
  bool cached = false;      // read from the cache rather than measured now

  nlohmann::json to_json() const;
  // A calibration of this machine: the cached one when its CPU, thread count and GEMM paths match, else
  // measured now and written to the cache.
  static Calibration of_this_machine();
  // Milliseconds for a step of these FLOPs and allocated bytes.
  double estimate_ms(const FlopCounts& flops, double allocated_bytes) const;
  std::string str() const;  // "AMD EPYC, 2 threads: f32 GEMM 80.1 GFLOP/s, ..."
};

// The cache file for this CPU and thread count.
std::string calibration_cache_path();
// The folder the planner caches its measurements in (see above), and lscpu's model name.
std::string memgrad_cache_dir();
std::string cpu_model_name();

}  // namespace mg
