// The reports of a model split over devices, on a tiny GPT: memory.html holds one timeline per
// device whose peak is that device's allocator peak of the profiled step (metrics.csv), a
// pipelined run's timelines each show their own stage's forward and backward, a single-device
// page has one timeline and no device table, and `memgrad report --run` prints each device's peaks
// by category from device_peaks.json, with its errors for a folder that is not a run.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "apps/apps_test_util.h"
#include "apps/device_peaks_file.h"
#include "apps/gpt_train.h"
#include "core/allocator.h"

using namespace mg;
using namespace mg::test;

namespace {

GptTrainOptions tiny_split_run(const std::string& data, const std::string& out) {
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 4, .n_head = 2, .d_model = 32};
  o.data = data;
  o.out = out;
  o.steps = 3;  // the profile records the second step
  o.batch = 4;
  o.eval_every = 3;
  o.eval_windows = 2;
  o.save_checkpoints = false;
  o.progress = ProgressStyle::none;
  o.techniques.profile = true;
  o.parallel.split = SplitSpec::parse("stages:2");
  o.parallel.devices = parse_devices("cpu:3,cpu:4");
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// memory.html's timelines: device -> the peak bytes its section states.
std::map<std::string, int64_t> timeline_peaks(const std::string& html) {
  std::map<std::string, int64_t> out;
  const std::string sec = "<section class=\"device\" data-device=\"", peak = "class=\"peak-summary\" data-peak-bytes=\"";
  for (size_t at = html.find(sec); at != std::string::npos; at = html.find(sec, at + 1)) {
    const size_t name = at + sec.size();
    const std::string device = html.substr(name, html.find('"', name) - name);
    const size_t p = html.find(peak, at) + peak.size();
    out[device] = std::stoll(html.substr(p, html.find('"', p) - p));
  }
  return out;
}

// The step phases drawn under device d's timeline.
std::vector<std::string> phases_of(const std::string& html, const std::string& device) {
  const size_t begin = html.find("<section class=\"device\" data-device=\"" + device + "\"");
  const size_t end = html.find("</section>", begin);
  std::vector<std::string> out;
  const std::string key = "class=\"phase\" data-phase=\"";
  for (size_t at = html.find(key, begin); at < end; at = html.find(key, at + 1)) {
    const size_t p = at + key.size();
    out.push_back(html.substr(p, html.find('"', p) - p));
  }
  return out;
}

}  // namespace

TEST_CASE("memory.html of a split run: a timeline per device, each peaking at its allocator's peak",
          "[apps][parallel][profiler][report]") {
  DataTempDir tmp("mp_report_html");
  const std::string data = write_tiny_token_file(tmp);
  const GptTrainResult r = gpt_train(tiny_split_run(data, tmp.file("split")));
  const std::string html = read_file(r.run_dir + "/memory.html");
  const std::map<std::string, int64_t> peaks = timeline_peaks(html);
  REQUIRE(peaks.size() == 2);
  for (const std::string device : {"cpu:3", "cpu:4"}) {
    INFO(device);
    REQUIRE(peaks.count(device));
    // The profiled step is the second (index 1): its metrics.csv row holds the allocator's peak.
    CHECK(peaks.at(device) == std::stoll(metrics_column(r.run_dir, "peak_bytes@" + device).at(1)));
    CHECK(html.find("<tr data-device=\"" + device + "\"><td>" + device + "</td><td data-bytes=\"" +
                    std::to_string(peaks.at(device)) + "\"") != std::string::npos);  // the devices' table
    const std::vector<std::string> ph = phases_of(html, device);
    CHECK(std::find(ph.begin(), ph.end(), "backward") != ph.end());
  }
  CHECK(html.find("share their time axis") != std::string::npos);

  // report --run: each device's peaks by category (device_peaks.json), then the profile.
  const std::string text = run_memory_report(r.run_dir);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("stages:2 over cpu:3,cpu:4"));
  const DevicePeaksFile f = read_device_peaks(r.run_dir);
  REQUIRE(f.measured.size() == 2);
  CHECK(f.steps == 3);
  for (size_t i = 0; i < 2; ++i) {
    const DevicePeak& p = f.measured[i];
    CHECK(p.device == r.device_peaks[i].device);
    CHECK(p.peak == r.device_peaks[i].peak);
    CHECK(p.category == r.device_peaks[i].category);
    CHECK(p.of(MemoryCategory::parameter) > 0);
    CHECK_THAT(text, Catch::Contains(format_bytes(p.peak)) &&
                         Catch::Contains(format_bytes(p.of(MemoryCategory::optimizer_state))));
  }
  CHECK_THAT(text, Catch::Contains("optim state") && Catch::Contains("modules"));
  CHECK_THAT(text, Catch::Contains("highest step peak in metrics.csv (3 steps): cpu:3 "));
  CHECK_THAT(text, Catch::Contains("device cpu:4: peak allocated " + format_bytes(peaks.at("cpu:4"))));

  // A folder that is not a run, a run without the file, a damaged file: errors naming them.
  CHECK_THROWS_WITH(run_memory_report(tmp.file("nowhere")), Catch::Contains("does not exist"));
  std::filesystem::remove(device_peaks_path(r.run_dir));
  CHECK_THROWS_WITH(run_memory_report(r.run_dir), Catch::Contains("wrote no per-device peaks"));
  std::ofstream(device_peaks_path(r.run_dir)) << "{\"format\": \"memgrad-device-peaks\", \"devices\": [{}]}";
  CHECK_THROWS_WITH(run_memory_report(r.run_dir), Catch::Contains("device_peaks.json is malformed"));
}

TEST_CASE("memory.html of a pipelined run: each device's strip shows its own stage's phases, one device unchanged",
          "[apps][parallel][profiler][report]") {
  DataTempDir tmp("mp_report_pipe");
  const std::string data = write_tiny_token_file(tmp);
  GptTrainOptions o = tiny_split_run(data, tmp.file("pipe"));
  o.techniques.micro_batch = 1;
  o.parallel.pipeline = PipelineKind::one_f_one_b;
  const GptTrainResult r = gpt_train(o);
  const std::string html = read_file(r.run_dir + "/memory.html");
  const std::map<std::string, int64_t> peaks = timeline_peaks(html);
  REQUIRE(peaks.size() == 2);
  for (const std::string device : {"cpu:3", "cpu:4"}) {
    INFO(device);
    CHECK(peaks.at(device) == std::stoll(metrics_column(r.run_dir, "peak_bytes@" + device).at(1)));
    const std::vector<std::string> ph = phases_of(html, device);
    CHECK(std::count(ph.begin(), ph.end(), "forward") >= 1);
    CHECK(std::count(ph.begin(), ph.end(), "backward") >= 1);
  }

  GptTrainOptions one = tiny_split_run(data, tmp.file("one"));
  one.parallel = {};
  one.device = "cpu:3";
  const GptTrainResult s = gpt_train(one);
  const std::string single = read_file(s.run_dir + "/memory.html");
  const std::map<std::string, int64_t> one_peak = timeline_peaks(single);
  REQUIRE(one_peak.size() == 1);
  CHECK(one_peak.at("cpu:3") == std::stoll(metrics_column(s.run_dir, "peak_bytes").at(1)));
  CHECK(single.find("class=\"devices\"") == std::string::npos);
  // report --run works on one device too: its one row.
  CHECK_THAT(run_memory_report(s.run_dir), Catch::Contains("on cpu:3") && Catch::Contains("all"));
}
