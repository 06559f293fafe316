// The memory profiler on a tiny GPT training loop: its peak equals the allocator's peak statistic,
// every event is tagged, saved activations are freed as backward runs, gradients are dropped by
// zero_grad, and memory.json is a Chrome trace with one counter track per category.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/memory_profile_test_util.h"

using namespace mg;

namespace {
Device dev(int i) { return Device(DeviceType::cpu, i); }
}  // namespace

TEST_CASE("memory profiler: peak equals the allocator's peak and every event is tagged", "[profiler]") {
  const Device d = dev(11);
  MemoryProfiler prof({d});
  test::profile_tiny_gpt(prof, d, 2);
  const MemoryProfileSummary s = prof.summary();
  const DeviceMemoryProfile& p = s.device(d);
  CHECK(p.peak_bytes == memory_stats(d).allocated.peak);
  CHECK(p.peak_bytes > p.start_bytes);
  CHECK(p.num_events == int64_t(prof.events().size()));
  REQUIRE(!prof.events().empty());
  int64_t at_peak = 0, live_sum = 0;
  for (int64_t b : p.at_peak) at_peak += b;
  for (const LiveTensor& t : p.live_at_peak) live_sum += t.bytes;
  CHECK(at_peak == p.peak_bytes);
  CHECK(live_sum == p.peak_bytes);
  for (size_t i = 1; i < p.live_at_peak.size(); ++i) CHECK(p.live_at_peak[i - 1].bytes >= p.live_at_peak[i].bytes);
  CHECK(p.peak_phase != StepPhase::none);
  std::set<std::string> mods;
  for (const ProfileEvent& e : prof.events()) {
    CHECK(int(e.category) < kNumMemoryCategories);
    CHECK(e.phase != StepPhase::none);  // everything ran inside a StepPhaseGuard
    CHECK(e.bytes > 0);
    mods.insert(prof.modules()[e.module]);
  }
  // Module paths of the blocks reach the profiler (e.g. "h.0.attn").
  bool has_block_path = false;
  for (const std::string& m : mods) has_block_path = has_block_path || m.rfind("h.", 0) == 0;
  INFO("module paths seen: " << mods.size());
  CHECK(has_block_path);
  // The allocation and its free carry the same category.
  std::map<uint64_t, MemoryCategory> cat;
  for (const ProfileEvent& e : prof.events()) {
    if (e.kind == MemoryEvent::Kind::alloc) cat[e.block_id] = e.category;
    else if (cat.count(e.block_id)) CHECK(cat[e.block_id] == e.category);
  }
}

TEST_CASE("memory profiler: backward frees saved activations, zero_grad drops gradients", "[profiler]") {
  const Device d = dev(12);
  MemoryProfiler prof({d});
  test::profile_tiny_gpt(prof, d, 2);
  const std::vector<MemoryProfiler::Point> tl = prof.timeline(d);
  const size_t act = size_t(MemoryCategory::activation), grad = size_t(MemoryCategory::gradient);
  // The last step's backward span in the timeline.
  size_t last_bwd_end = 0;
  for (size_t i = 0; i < tl.size(); ++i)
    if (tl[i].phase == StepPhase::backward) last_bwd_end = i;
  REQUIRE(last_bwd_end > 0);
  size_t bwd_begin = last_bwd_end;
  while (bwd_begin > 0 && tl[bwd_begin - 1].phase == StepPhase::backward) --bwd_begin;
  // Activation bytes when backward starts (end of forward) against its end: saved tensors went.
  const int64_t act_at_start = tl[bwd_begin - 1].bytes[act], act_at_end = tl[last_bwd_end].bytes[act];
  INFO("activation bytes at backward start " << act_at_start << ", at its end " << act_at_end);
  CHECK(act_at_end < act_at_start / 4);
  int64_t freed_in_bwd = 0;
  for (const ProfileEvent& e : prof.events())
    if (e.phase == StepPhase::backward && e.category == MemoryCategory::activation && e.kind == MemoryEvent::Kind::free)
      freed_in_bwd += e.bytes;
  CHECK(freed_in_bwd > 0);
  // Gradients exist after backward and are all gone after the optimizer phase (zero_grad).
  CHECK(tl[last_bwd_end].bytes[grad] > 0);
  CHECK(tl.back().phase == StepPhase::optimizer);
  CHECK(tl.back().bytes[grad] == tl.front().bytes[grad]);
  int64_t grad_freed_in_opt = 0;
  for (const ProfileEvent& e : prof.events())
    if (e.phase == StepPhase::optimizer && e.category == MemoryCategory::gradient && e.kind == MemoryEvent::Kind::free)
      grad_freed_in_opt += e.bytes;
  CHECK(grad_freed_in_opt > 0);
}

TEST_CASE("memory profiler: memory.json is a trace with a counter track per category", "[profiler]") {
  const Device d = dev(13);
  MemoryProfiler prof({d});
  test::profile_tiny_gpt(prof, d, 1);
  const std::string dir = (std::filesystem::temp_directory_path() / "mg_test_profiler_json").string();
  std::filesystem::remove_all(dir);
  prof.write(dir);
  std::ifstream f(dir + "/memory.json");
  nlohmann::json j = nlohmann::json::parse(f);
  REQUIRE(j.contains("traceEvents"));
  std::set<std::string> counters, phases;
  int64_t max_total_at_ts = 0;
  for (const auto& e : j["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    if (e["ph"] == "C") {
      counters.insert(e["name"].get<std::string>());
      CHECK(e["args"]["bytes"].get<int64_t>() >= 0);
      max_total_at_ts = std::max(max_total_at_ts, e["args"]["bytes"].get<int64_t>());
    }
    if (e["ph"] == "X") phases.insert(e["name"].get<std::string>());
  }
  CHECK(counters.size() == size_t(kNumMemoryCategories));
  CHECK(phases == std::set<std::string>{"forward", "backward", "optimizer"});
  CHECK(j["memgrad"]["devices"][0]["peak_bytes"].get<int64_t>() == prof.summary().device(d).peak_bytes);
  CHECK_THROWS_WITH(prof.summary().device(dev(14)), Catch::Contains("has no device cpu:14"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("memory profiler: phase spans come from the phase changes and cover every tagged event", "[profiler]") {
  const Device d = dev(15);
  MemoryProfiler prof({d});
  test::profile_tiny_gpt(prof, d, 2);
  const std::vector<MemoryProfiler::PhaseSpan> spans = prof.phase_spans();
  // Two steps: forward, backward, optimizer, twice, in order, each span after the previous one.
  std::vector<StepPhase> order;
  for (const auto& sp : spans) order.push_back(sp.phase);
  using P = StepPhase;
  CHECK(order == std::vector<StepPhase>{P::forward, P::backward, P::optimizer, P::forward, P::backward, P::optimizer});
  for (size_t i = 0; i < spans.size(); ++i) {
    CHECK(spans[i].end_us > spans[i].begin_us);
    if (i > 0) CHECK(spans[i].begin_us >= spans[i - 1].end_us);
  }
  // Every event lies inside a span of its own phase (the optimizer span reaches past the last
  // gradient free, since it ends when the phase does, not at its last allocation).
  for (const ProfileEvent& e : prof.events()) {
    bool inside = false;
    for (const auto& sp : spans) inside = inside || (sp.phase == e.phase && e.t_us >= sp.begin_us && e.t_us <= sp.end_us);
    CHECK(inside);
  }
  // memory.html draws one strip rectangle per span.
  const std::string html = prof.html();
  size_t rects = 0;
  for (size_t at = html.find("class=\"phase\""); at != std::string::npos; at = html.find("class=\"phase\"", at + 1)) ++rects;
  CHECK(rects == spans.size());
  // No listener is left behind: phase changes after stop() are not recorded.
  { StepPhaseGuard g(StepPhase::forward); }
  CHECK(prof.phase_spans().size() == spans.size());
}
