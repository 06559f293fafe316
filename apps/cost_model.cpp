// The calibrated cost model (see cost_model.h): measuring the rates, caching them, estimating.
#include "apps/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/cpu_gemm.h"
#include "ops/ops.h"

namespace mg {

namespace fs = std::filesystem;

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

namespace {

// The fastest of `reps` runs of fn, in seconds (the least disturbed by other work).
template <class F>
double best_seconds(int reps, F fn) {
  fn();  // warm-up: caches, pages, the allocator's pools
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Tensor filled(const Shape& s, DType dt) {
  Tensor t = empty(s, {.dtype = dt});
  fill_(t, 0.25);
  return t;
}

Calibration measure() {
  Calibration c;
  c.cpu = cpu_model_name();
  c.threads = num_threads();
  c.gemm = cpu_gemm_backend();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  // GEMMs of a GPT-ish shape: (B*T, C) x (C, 4C); the fastest of 5 (a shared machine slows some).
  const int64_t M = 2048, K = 512, N = 2048;
  const double gemm = 2.0 * double(M) * double(N) * double(K);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor a = filled({M, K}, dt), b = filled({K, N}, dt);
    const double s = best_seconds(5, [&] { (void)matmul(a, b); });
    c.gflops[size_t(gemm_kind(dt))] = gemm / s / 1e9;
  }
  // A MobileNetV2-ish depthwise 3x3 convolution: (16, 96, 56, 56).
  {
    Tensor x = filled({16, 96, 56, 56}, DType::f32), w = filled({96, 1, 3, 3}, DType::f32);
    const double flops = 2.0 * 16 * 96 * 56 * 56 * 9;
    const double s = best_seconds(5, [&] { (void)conv2d(x, w, Tensor(), {.stride = 1, .padding = 1, .groups = 96}); });
    c.gflops[size_t(FlopKind::direct)] = flops / s / 1e9;
  }
  // Dense convolutions: a MobileNetV2 block's pointwise pair at batch 16, 32x32 (expand 32 -> 192,
  // project 192 -> 32), forward and backward (dx, dW), in f32 and in bf16.
  EnableGradGuard grad;  // whoever asks for the rates may be inside a NoGradGuard
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 16, hw = 32, narrow = 32, wide = 192;
    Tensor x = filled({n, narrow, hw, hw}, dt).set_requires_grad(true);
    Tensor we = filled({wide, narrow, 1, 1}, dt).set_requires_grad(true);
    Tensor wp = filled({narrow, wide, 1, 1}, dt).set_requires_grad(true);
    const Tensor dout = filled({n, narrow, hw, hw}, dt);
    const double flops = 3.0 * 2.0 * (2.0 * double(n * hw * hw) * double(narrow * wide));
    const double s = best_seconds(5, [&] {
      for (const Tensor* t : {&x, &we, &wp}) t->set_grad(Tensor());
      backward(conv2d(conv2d(x, we, Tensor(), {}), wp, Tensor(), {}), dout);
    });
    c.gflops[size_t(conv_kind(dt))] = flops / s / 1e9;
  }
  // Bandwidth: a 64 MiB copy reads and writes every byte.
  {
    const int64_t n = int64_t(16) << 20;
    Tensor src = filled({n}, DType::f32), dst = filled({n}, DType::f32);
    const double s = best_seconds(5, [&] { copy_(dst, src); });
    c.gbytes_per_s = 2.0 * 4.0 * double(n) / s / 1e9;
  }
  return c;
}

}  // namespace

std::string memgrad_cache_dir() {
  fs::path dir;
  if (const char* d = std::getenv("MG_CACHE_DIR"); d && *d) dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = fs::path(x) / "memgrad";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = fs::path(h) / ".cache" / "memgrad";
  else dir = fs::temp_directory_path() / "memgrad";
  return dir.string();
}

std::string calibration_cache_path() {
  return (fs::path(memgrad_cache_dir()) / ("calibration-" + std::to_string(num_threads()) + "threads.json"))
      .string();
}

nlohmann::json Calibration::to_json() const {
  nlohmann::json j{{"cpu", cpu}, {"threads", threads}, {"gemm", gemm}, {"gbytes_per_s", gbytes_per_s}};
  for (size_t k = 0; k < kNumFlopKinds; ++k) j["gflops_" + std::string(flop_kind_name(FlopKind(k)))] = gflops[k];
  return j;
}

Calibration Calibration::of_this_machine() {
  const std::string path = calibration_cache_path();
  const std::string cpu = cpu_model_name();
  try {  // a cache that is missing, unreadable or for another machine is measured anew
    std::ifstream f(path);
    if (f) {
      const nlohmann::json j = nlohmann::json::parse(f);
      // A GEMM path switched since (MG_GEMM_KERNEL, MG_BF16_DOT, MG_AMX) runs at other rates.
      if (j.at("cpu").get<std::string>() == cpu && j.at("threads").get<int>() == num_threads() &&
          j.value("gemm", std::string()) == cpu_gemm_backend()) {
        Calibration c;
        c.cpu = cpu;
        c.threads = num_threads();
        c.gemm = cpu_gemm_backend();
        c.gbytes_per_s = j.at("gbytes_per_s").get<double>();
        for (size_t k = 0; k < kNumFlopKinds; ++k)
          c.gflops[k] = j.at("gflops_" + std::string(flop_kind_name(FlopKind(k)))).get<double>();
        bool sane = c.gbytes_per_s > 0;
        for (double g : c.gflops) sane = sane && g > 0;
        if (sane) {
          c.path = path;
          c.cached = true;
          return c;
        }
      }
    }
  } catch (const std::exception&) {
  }
  Calibration c = measure();
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  std::ofstream out(path + ".tmp");
  if (!ec && out) {
    out << c.to_json().dump(2) << "\n";
    out.close();
    fs::rename(path + ".tmp", path, ec);
    if (!ec) c.path = path;
  }
  return c;
}

double Calibration::estimate_ms(const FlopCounts& work) const {
  double s = 2.0 * 4.0 * work.elements / (gbytes_per_s * 1e9);
  for (size_t k = 0; k < kNumFlopKinds; ++k) s += work.flops[k] / (gflops[k] * 1e9);
  return 1e3 * s;
}

std::string Calibration::str() const {
  char line[320];
  std::snprintf(line, sizeof line,
                "%s, %d threads: f32 GEMM %.1f GFLOP/s, bf16 GEMM %.1f GFLOP/s, depthwise conv %.1f GFLOP/s, "
                "pointwise conv f32 %.1f / bf16 %.1f GFLOP/s, copy %.1f GB/s",
                cpu.c_str(), threads, gflops[0], gflops[1], gflops[2], gflops[3], gflops[4], gbytes_per_s);
  return line;
}

}  // namespace mg
