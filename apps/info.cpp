// `memgrad info`: how this memgrad was built (version, build type, compiler, CUDA, -march,
// sanitizers, the SIMD extensions the kernels were compiled for, the GEMM library and int8 path, OpenMP
// threads) and the devices it can use, with each active device's memory pool statistics and
// limit. The first thing to paste into a bug report or next to a benchmark number.
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <cblas.h>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.h"
#include "core/allocator.h"
#include "core/build_info.h"
#include "core/cuda/backend.h"
#include "core/device.h"
#include "core/parallel.h"
#include "ops/cpu_gemm.h"
#include "ops/int8_gemm.h"

namespace mg {
namespace {

// The SIMD extensions this translation unit was compiled for. Every library target gets the
// same flags (MG_CXX_FLAGS), so this is what the kernels use too.
std::string simd_flags() {
  std::vector<const char*> f;
#ifdef __SSE4_2__
  f.push_back("SSE4.2");
#endif
#ifdef __AVX__
  f.push_back("AVX");
#endif
#ifdef __AVX2__
  f.push_back("AVX2");
#endif
#ifdef __FMA__
  f.push_back("FMA");
#endif
#ifdef __F16C__
  f.push_back("F16C");
#endif
#ifdef __AVX512F__
  f.push_back("AVX512F");
#endif
#ifdef __AVX512BW__
  f.push_back("AVX512BW");
#endif
#ifdef __AVX512VL__
  f.push_back("AVX512VL");
#endif
#ifdef __AVX512BF16__
  f.push_back("AVX512BF16");
#endif
#ifdef __ARM_NEON
  f.push_back("NEON");
#endif
#ifdef __ARM_FEATURE_SVE
  f.push_back("SVE");
#endif
  std::string s;
  for (const char* x : f) s += (s.empty() ? "" : " ") + std::string(x);
  return s.empty() ? "none beyond the baseline ISA" : s;
}

std::string on_off(const char* cmake_bool) {
  std::string v = cmake_bool;
  return (v == "ON" || v == "TRUE" || v == "1") ? "on" : "off";
}

// A "Key:  1234 kB" line of /proc/meminfo in bytes; -1 when the file or key is missing.
int64_t meminfo_bytes(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream is(line.substr(key.size() + 1));
    int64_t kb = -1;
    is >> kb;
    return kb < 0 ? -1 : kb * 1024;
  }
  return -1;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    auto colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown CPU";
}

std::string bytes_or_unknown(int64_t b) { return b < 0 ? std::string("unknown") : format_bytes(b); }

void row(const char* key, const std::string& value) { std::printf("  %-14s %s\n", key, value.c_str()); }

void print_info() {
  std::printf("memgrad %s (%s)\n\n", MG_VERSION, *MG_GIT_REV ? MG_GIT_REV : "unknown revision");

  std::printf("build\n");
  row("type", MG_BUILD_TYPE);
  row("compiler", std::string(MG_CXX_COMPILER) + ", C++" + std::to_string(__cplusplus / 100 % 100));
  row("CUDA", on_off(MG_CUDA_ENABLED_STR) == "on" ? "on (built with nvcc)" : "off");
  row("-march=native", on_off(MG_NATIVE_STR));
  row("sanitizers", on_off(MG_SANITIZE_STR) == "on" ? "AddressSanitizer + UBSan" : "off");
  row("SIMD", simd_flags());
  row("Eigen", std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                   std::to_string(EIGEN_MINOR_VERSION));
  row("CPU GEMM", cpu_gemm_backend());
  // The CPU's path, and the GPU kernel that quantized layers use on cuda:N when a GPU is visible.
  row("int8 GEMM", std::string(int8_gemm_path()) +
                       (cuda::device_count() > 0 ? std::string("; on cuda:N: ") + int8_gemm_cuda_path() : ""));
  row("OpenBLAS", openblas_get_config());
  row("threads", std::to_string(num_threads()) + " OpenMP threads (of " +
                     std::to_string(std::thread::hardware_concurrency()) +
                     " hardware threads; set OMP_NUM_THREADS)");

  std::printf("\ndevices\n");
  row("cpu:N", cpu_model() + "; host memory " + bytes_or_unknown(meminfo_bytes("MemTotal")) + " total, " +
                   bytes_or_unknown(meminfo_bytes("MemAvailable")) +
                   " available; each index is its own pool and budget");
  row("meta", "shapes and bytes only, no data: exact memory timelines without compute");
  // From the CUDA runtime itself (cudaGetDeviceCount), one row per visible GPU.
  if (!cuda::is_built()) {
    row("cuda:N", "not available (built without CUDA: configure with `cmake --preset cuda`)");
  } else if (const int n = cuda::device_count(); n == 0) {
    const std::string why = cuda::device_count_error();
    row("cuda:N", "CUDA built, no device" + (why.empty() ? std::string() : " (" + why + ")"));
  } else {
    for (int i = 0; i < n; ++i) row(("cuda:" + std::to_string(i)).c_str(), cuda::device_description(i));
  }

  // cpu:0 and meta always exist; list them plus any pool created before this point.
  allocator_for(kCPU);
  allocator_for(kMeta);
  std::printf("\nmemory pools\n");
  for (const Device& d : active_devices()) {
    std::istringstream summary(memory_summary(d));
    for (std::string line; std::getline(summary, line);) std::printf("  %s\n", line.c_str());
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  CLI::App* info = app.add_subcommand(
      "info", "Print version, build options, threads and devices with their memory pools");
  info->callback(print_info);
}

}  // namespace mg
