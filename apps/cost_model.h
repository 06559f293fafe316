// The planner's time estimate: a step costs its FLOPs at this machine's measured rates plus the
// elements of the tensors it creates, as f32 bytes at the measured copy bandwidth (each written
// once and read once; a 16-bit element costs an f32 one's: FlopCounts::elements). The
// rates are measured once per CPU model and thread count (an f32 and a bf16 GEMM, a depthwise
// convolution, a pointwise convolution pair forward and backward in f32 and bf16, a large copy;
// about a second) and cached as JSON under the user's cache folder
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
  // Milliseconds for a step of these FLOPs and created elements.
  double estimate_ms(const FlopCounts& work) const;
  std::string str() const;  // "AMD EPYC, 2 threads: f32 GEMM 80.1 GFLOP/s, ..."
};

// The cache file for this CPU and thread count.
std::string calibration_cache_path();
// The folder the planner caches its measurements in (see above), and lscpu's model name.
std::string memgrad_cache_dir();
std::string cpu_model_name();

}  // namespace mg
