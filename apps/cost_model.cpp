// The calibrated cost model (see cost_model.h): measuring the rates, caching them, estimating.
#include "apps/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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

// The median of `reps` runs of fn, in seconds: the statistic `--verify` and the timed pieces
// report for steps, so that a rate is what a typical run sees on this (possibly shared) machine,
// not its least disturbed moment.
template <class F>
double median_seconds(int reps, F fn) {
  fn();  // warm-up: caches, pages, the allocator's pools
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[size_t(reps / 2)];
}

Tensor filled(const Shape& s, DType dt) {
  Tensor t = empty(s, {.dtype = dt});
  fill_(t, 0.25);
  return t;
}

// The created tensors' share of a timed kernel, at c's bandwidths (Note [Reuse distance]): the
// step charges those elements on their own, so a kernel's rate is its work over the rest of its
// time. Counted in one untimed run (the counter's bookkeeping would slow the timed ones).
template <class F>
double elements_seconds(const Calibration& c, F fn) {
  FlopCounts work;
  {
    FlopCounter counter;
    fn();
    work = counter.counts();
  }
  work.flops = {};
  return c.estimate_ms(work) / 1e3;
}

// The rate of a kernel doing `work` units per call, net of its created tensors' elements; the
// net time is kept at a tenth of the measured one or more, so a curve measured under other load
// cannot make a rate unbounded.
template <class F>
double net_rate(const Calibration& c, double work, F fn) {
  const double s = median_seconds(7, fn);
  return work / std::max(s - elements_seconds(c, fn), 0.1 * s) / 1e9;
}

Calibration measure() {
  Calibration c;
  c.cpu = cpu_model_name();
  c.threads = num_threads();
  c.gemm = cpu_gemm_backend();
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  // Bandwidth by working set first (the kernels' rates below are net of their tensors' elements
  // at these rates), timed on an element-wise op as a step runs them, not on memcpy (whose
  // streaming stores run about twice an op loop's bandwidth out of main memory, and the same out
  // of cache): y = x * 1.5 for x of 128 KiB ... 256 MiB, each y a new tensor (the allocator hands
  // back the block the previous y freed), so every byte is touched again after x + y bytes of
  // traffic. Each timing repeats the op to at least 64 MiB, so small working sets are not timer
  // noise.
  {
    const int64_t largest = int64_t(256) << 20;  // bytes of x: a 512 MiB working set
    const Tensor all = filled({largest / 4}, DType::f32);
    for (int64_t half = int64_t(128) << 10; half <= largest; half *= 2) {
      const Tensor x = narrow(all, 0, 0, half / 4);
      const int64_t repeats = std::max<int64_t>(1, (int64_t(64) << 20) / (2 * half));
      const double s = median_seconds(5, [&] {
        for (int64_t r = 0; r < repeats; ++r) (void)mul(x, 1.5);
      });
      c.bandwidth.push_back({.working_set_bytes = 2.0 * double(half),
                             .gbytes_per_s = 2.0 * double(half) * double(repeats) / s / 1e9});
    }
  }
  empty_cache(kCPU);  // the bandwidth's 512 MiB go back now, not with the next plan's fresh pool
  // GEMMs of a GPT-ish shape: (B*T, C) x (C, 4C).
  const int64_t M = 2048, K = 512, N = 2048;
  const double gemm = 2.0 * double(M) * double(N) * double(K);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor a = filled({M, K}, dt), b = filled({K, N}, dt);
    c.gflops[size_t(gemm_kind(dt))] = net_rate(c, gemm, [&] { (void)matmul(a, b); });
  }
  EnableGradGuard grad;  // whoever asks for the rates may be inside a NoGradGuard
  // A MobileNetV2-ish depthwise 3x3 convolution, (16, 96, 56, 56), forward and backward (dx, dW):
  // its backward reduces over every image and position per channel and runs slower than its
  // forward, so a forward alone would rate a step's depthwise work too fast.
  {
    Tensor x = filled({16, 96, 56, 56}, DType::f32).set_requires_grad(true);
    Tensor w = filled({96, 1, 3, 3}, DType::f32).set_requires_grad(true);
    const Tensor dout = filled({16, 96, 56, 56}, DType::f32);
    const double flops = 3.0 * 2.0 * 16 * 96 * 56 * 56 * 9;
    c.gflops[size_t(FlopKind::direct)] = net_rate(c, flops, [&] {
      for (const Tensor* t : {&x, &w}) t->set_grad(Tensor());
      backward(conv2d(x, w, Tensor(), {.stride = 1, .padding = 1, .groups = 96}), dout);
    });
  }
  // Dense convolutions: a MobileNetV2 block's pointwise pair at batch 16, 32x32 (expand 32 -> 192,
  // project 192 -> 32), forward and backward (dx, dW), in f32 and in bf16.
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 16, hw = 32, narrow = 32, wide = 192;
    Tensor x = filled({n, narrow, hw, hw}, dt).set_requires_grad(true);
    Tensor we = filled({wide, narrow, 1, 1}, dt).set_requires_grad(true);
    Tensor wp = filled({narrow, wide, 1, 1}, dt).set_requires_grad(true);
    const Tensor dout = filled({n, narrow, hw, hw}, dt);
    const double flops = 3.0 * 2.0 * (2.0 * double(n * hw * hw) * double(narrow * wide));
    c.gflops[size_t(conv_kind(dt))] = net_rate(c, flops, [&] {
      for (const Tensor* t : {&x, &we, &wp}) t->set_grad(Tensor());
      backward(conv2d(conv2d(x, we, Tensor(), {}), wp, Tensor(), {}), dout);
    });
  }
  // A MobileNetV2 block's batch norm + ReLU6 in training, (16, 96, 32, 32), forward and backward:
  // its passes beyond the one write and read of y and dx (FlopKind::batch_norm), two per element.
  {
    const int64_t n = 16, ch = 96, hw = 32;
    Tensor x = filled({n, ch, hw, hw}, DType::f32).set_requires_grad(true);
    Tensor w = filled({ch}, DType::f32).set_requires_grad(true);
    Tensor b = filled({ch}, DType::f32).set_requires_grad(true);
    const Tensor rm = filled({ch}, DType::f32), rv = filled({ch}, DType::f32);
    const Tensor dout = filled({n, ch, hw, hw}, DType::f32);
    c.gflops[size_t(FlopKind::batch_norm)] = net_rate(c, 2.0 * double(x.numel()), [&] {
      for (const Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
      backward(batch_norm_relu6(x, rm, rv, w, b, true, 0.1, 1e-5), dout);
    });
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
  nlohmann::json j{{"version", kCalibrationVersion}, {"cpu", cpu}, {"threads", threads}, {"gemm", gemm}};
  for (size_t k = 0; k < kNumFlopKinds; ++k) j["gflops_" + std::string(flop_kind_name(FlopKind(k)))] = gflops[k];
  j["bandwidth"] = nlohmann::json::array();
  for (const BandwidthPoint& b : bandwidth)
    j["bandwidth"].push_back({{"working_set_bytes", b.working_set_bytes}, {"gbytes_per_s", b.gbytes_per_s}});
  return j;
}

Calibration Calibration::of_this_machine() {
  const std::string path = calibration_cache_path();
  const std::string cpu = cpu_model_name();
  try {  // a cache that is missing, unreadable or for another machine is measured anew
    std::ifstream f(path);
    if (f) {
      const nlohmann::json j = nlohmann::json::parse(f);
      // A GEMM path switched since (MG_GEMM_KERNEL, MG_BF16_DOT, MG_AMX) runs at other rates; an
      // older cost model's cache lacks what this one measures (kCalibrationVersion).
      if (j.value("version", 0) == kCalibrationVersion && j.at("cpu").get<std::string>() == cpu &&
          j.at("threads").get<int>() == num_threads() &&
          j.value("gemm", std::string()) == cpu_gemm_backend()) {
        Calibration c;
        c.cpu = cpu;
        c.threads = num_threads();
        c.gemm = cpu_gemm_backend();
        for (size_t k = 0; k < kNumFlopKinds; ++k)
          c.gflops[k] = j.at("gflops_" + std::string(flop_kind_name(FlopKind(k)))).get<double>();
        for (const nlohmann::json& b : j.at("bandwidth"))
          c.bandwidth.push_back({.working_set_bytes = b.at("working_set_bytes").get<double>(),
                                 .gbytes_per_s = b.at("gbytes_per_s").get<double>()});
        bool sane = !c.bandwidth.empty();
        for (size_t i = 0; i < c.bandwidth.size(); ++i)
          sane = sane && c.bandwidth[i].gbytes_per_s > 0 &&
                 (i == 0 || c.bandwidth[i].working_set_bytes > c.bandwidth[i - 1].working_set_bytes);
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

double Calibration::gbytes_per_s_at(double working_set_bytes) const {
  MG_INTERNAL_ASSERT(!bandwidth.empty(), "a calibration without bandwidths");
  if (working_set_bytes <= bandwidth.front().working_set_bytes) return bandwidth.front().gbytes_per_s;
  for (size_t i = 1; i < bandwidth.size(); ++i)
    if (working_set_bytes <= bandwidth[i].working_set_bytes) {
      const BandwidthPoint& a = bandwidth[i - 1];
      const BandwidthPoint& b = bandwidth[i];
      const double f = std::log(working_set_bytes / a.working_set_bytes) / std::log(b.working_set_bytes / a.working_set_bytes);
      return a.gbytes_per_s + f * (b.gbytes_per_s - a.gbytes_per_s);
    }
  return bandwidth.back().gbytes_per_s;
}

double Calibration::estimate_ms(const FlopCounts& work) const {
  double s = 0;
  for (size_t k = 0; k < kNumReuseBuckets; ++k)
    if (work.elements_by_reuse[k] > 0)
      s += 2.0 * 4.0 * work.elements_by_reuse[k] / (gbytes_per_s_at(reuse_bucket_bytes(k)) * 1e9);
  for (size_t k = 0; k < kNumFlopKinds; ++k)
    if (work.flops[k] > 0) s += work.flops[k] / (gflops[k] * 1e9);
  return 1e3 * s;
}

std::string Calibration::str() const {
  char line[400];
  std::snprintf(line, sizeof line,
                "%s, %d threads: f32 GEMM %.1f GFLOP/s, bf16 GEMM %.1f GFLOP/s, forward + backward: depthwise conv "
                "%.1f GFLOP/s, pointwise conv f32 %.1f / bf16 %.1f GFLOP/s, batch norm %.2f G elements/s (its passes "
                "beyond its tensors' write and read); element-wise GB/s by working set:",
                cpu.c_str(), threads, gflops[0], gflops[1], gflops[2], gflops[3], gflops[4], gflops[5]);
  std::string s = line;
  for (const BandwidthPoint& b : bandwidth) {
    const double kib = b.working_set_bytes / 1024;
    std::snprintf(line, sizeof line, " %.0f%s %.1f", kib < 1024 ? kib : kib / 1024, kib < 1024 ? "K" : "M",
                  b.gbytes_per_s);
    s += line;
  }
  return s;
}

}  // namespace mg
