// The planner's cost model (apps/cost_model.h): created elements are charged at the element-wise
// bandwidth measured for a working set as large as their reuse distance, a cache of an older
// cost model is measured anew, and in a real step accumulation shortens the distances it charges.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "apps/cost_model.h"
#include "apps/plan_step.h"

using namespace mg;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A hand-made calibration: 1 GFLOP/s for every kind, bandwidth 40 GB/s up to 4 MiB falling to
// 10 GB/s at 256 MiB.
Calibration two_point_calibration() {
  Calibration c;
  for (double& g : c.gflops) g = 1.0;
  c.bandwidth = {{.working_set_bytes = 4 * kMiB, .gbytes_per_s = 40.0},
                 {.working_set_bytes = 256 * kMiB, .gbytes_per_s = 10.0}};
  return c;
}

}  // namespace

TEST_CASE("cost model: the bandwidth at a working set interpolates the measured points in log size", "[cost][apps]") {
  const Calibration c = two_point_calibration();
  CHECK(c.gbytes_per_s_at(1024) == 40.0);            // below the smallest: its rate
  CHECK(c.gbytes_per_s_at(4 * kMiB) == 40.0);
  CHECK(c.gbytes_per_s_at(32 * kMiB) == Approx(25.0));  // halfway in log2: 4 -> 256 MiB is 6 octaves, 32 MiB is 3
  CHECK(c.gbytes_per_s_at(256 * kMiB) == 10.0);
  CHECK(c.gbytes_per_s_at(4096 * kMiB) == 10.0);     // beyond the largest: its rate
}

TEST_CASE("cost model: created elements cost 8 bytes each at the bandwidth of their reuse distance", "[cost][apps]") {
  const Calibration c = two_point_calibration();
  FlopCounts near, far;
  near.elements = far.elements = 1e6;
  near.elements_by_reuse[reuse_bucket(1 * kMiB)] = 1e6;  // a temporary read by the next op
  far.elements_by_reuse[reuse_bucket(1024 * kMiB)] = 1e6;  // an activation read in the backward pass
  CHECK(c.estimate_ms(near) == Approx(1e3 * 8e6 / 40e9));
  CHECK(c.estimate_ms(far) == Approx(1e3 * 8e6 / 10e9));
  FlopCounts gemm = near;
  gemm.flops[size_t(FlopKind::gemm_f32)] = 2e9;  // 2 s at 1 GFLOP/s
  CHECK(c.estimate_ms(gemm) == Approx(2e3 + c.estimate_ms(near)));
}

TEST_CASE("cost model: a cache of an older cost model is measured anew, with a bandwidth by working set", "[cost][apps]") {
  const auto dir = std::filesystem::temp_directory_path() / ("memgrad-test-cost-model-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("MG_CACHE_DIR", dir.c_str(), 1);
  std::filesystem::create_directories(dir);
  const Calibration first = Calibration::of_this_machine();
  REQUIRE(first.path == calibration_cache_path());
  // What the cost model before the bandwidth curve wrote: one copy bandwidth, no version.
  nlohmann::json old = nlohmann::json::parse(std::ifstream(first.path));
  old.erase("version");
  old.erase("bandwidth");
  old["gbytes_per_s"] = 14.0;
  std::ofstream(first.path) << old.dump();
  const Calibration again = Calibration::of_this_machine();
  CHECK_FALSE(again.cached);
  CHECK(nlohmann::json::parse(std::ifstream(again.path)).at("version") == kCalibrationVersion);
  // 256 KiB ... 512 MiB in octaves, each rate measured.
  REQUIRE(again.bandwidth.size() == 12);
  CHECK(again.bandwidth.front().working_set_bytes == 256 * 1024);
  CHECK(again.bandwidth.back().working_set_bytes == 512 * kMiB);
  for (const BandwidthPoint& b : again.bandwidth) CHECK(b.gbytes_per_s > 0);
  CHECK(again.str().find("element-wise GB/s by working set: 256K") != std::string::npos);
  CHECK(Calibration::of_this_machine().cached);
  std::filesystem::remove_all(dir);
  ::setenv("MG_CACHE_DIR", (std::filesystem::temp_directory_path() / "memgrad-test-cache").c_str(), 1);
}

TEST_CASE("cost model: accumulation shortens the reuse distances of a step's saved activations", "[cost][apps]") {
  PlanWorkload w;
  w.name = "tiny-mobilenet";
  w.mobilenet = MobileNetV2Config{.width_mult = 0.25, .num_classes = 10, .small_input = true, .input_size = 16};
  w.batch = 8;
  TechniqueOptions whole, accum;
  accum.micro_batch = 2;
  const Device meta(DeviceType::meta, 0);
  const FlopCounts a = measure_step(w, whole, meta).flops, b = measure_step(w, accum, meta).flops;
  // The elements-weighted mean of log2(distance): a quarter of the batch per micro-step, so the
  // forward's tensors wait behind about a quarter of the bytes before the backward reads them.
  auto mean_log_distance = [](const FlopCounts& f) {
    double sum = 0, n = 0;
    for (size_t k = 0; k < kNumReuseBuckets; ++k) sum += f.elements_by_reuse[k] * double(k), n += f.elements_by_reuse[k];
    return sum / n;
  };
  INFO(mean_log_distance(a) << " vs " << mean_log_distance(b));
  CHECK(mean_log_distance(b) < mean_log_distance(a) - 1.0);
  // At rates that fall with the working set, the same work in micro-batches is estimated cheaper.
  Calibration c = two_point_calibration();
  c.bandwidth = {{.working_set_bytes = 64 * 1024, .gbytes_per_s = 40.0},
                 {.working_set_bytes = 16 * kMiB, .gbytes_per_s = 10.0}};
  for (double& g : c.gflops) g = 1e9;  // FLOPs free: the bytes alone
  CHECK(c.estimate_ms(b) / b.elements < c.estimate_ms(a) / a.elements);
}
