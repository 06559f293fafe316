// The meta device is exact: one Trainer step of a GPT (with dropout; attention-heavy and
// logits-heavy shapes) and of a MobileNetV2, under every checkpoint policy, precision,
// micro-batching and activation offload, peaks at the same bytes per category on meta as on
// cpu:0, with 1 and with 2 threads. The planner (`memgrad plan`) stands on this.
#include <catch2/catch.hpp>

#include "apps/plan_step.h"
#include "core/allocator.h"
#include "core/parallel.h"

using namespace mg;

namespace {

PlanWorkload tiny_gpt(int64_t vocab, int64_t context, int64_t d_model, int64_t heads, double dropout, int64_t batch) {
  PlanWorkload w;
  w.gpt = GPTConfig{.vocab_size = vocab, .context = context, .n_layer = 2, .n_head = heads, .d_model = d_model,
                    .dropout = dropout};
  w.batch = batch;
  w.grad_clip = 1.0;
  w.prefetch = 1;
  return w;
}

PlanWorkload tiny_mobilenet(int64_t batch) {
  PlanWorkload w;
  w.mobilenet = MobileNetV2Config{.width_mult = 0.25, .num_classes = 10, .small_input = true, .dropout = 0.2,
                                  .input_size = 16};
  w.batch = batch;
  return w;
}

TechniqueOptions techniques(const std::string& checkpoint, const std::string& precision, int64_t micro, bool offload) {
  TechniqueOptions t;
  t.checkpoint = CheckpointPolicy::parse(checkpoint);
  t.precision = parse_precision(precision);
  t.micro_batch = micro;
  if (offload) t.offload_activations = Device("cpu:1");
  return t;
}

// The allocations and frees of one device, for naming the first event where meta and cpu part.
struct Trace : AllocatorObserver {
  explicit Trace(Device d) : device(d) { add_allocator_observer(this); }
  ~Trace() override { remove_allocator_observer(this); }
  void on_event(const MemoryEvent& e) override {
    if (e.device != device) return;
    char line[160];
    std::snprintf(line, sizeof line, "%s %zu %s %s", e.kind == MemoryEvent::Kind::alloc ? "alloc" : "free",
                  e.kind == MemoryEvent::Kind::alloc ? e.requested : e.bytes, std::string(category_name(e.category)).c_str(),
                  e.op ? e.op : "?");
    events.emplace_back(line);
  }
  Device device;
  std::vector<std::string> events;
};

std::string first_difference(const Trace& a, const Trace& b) {
  for (size_t i = 0; i < std::max(a.events.size(), b.events.size()); ++i) {
    const std::string x = i < a.events.size() ? a.events[i] : "(end)", y = i < b.events.size() ? b.events[i] : "(end)";
    if (x != y) {
      std::string ctx;
      for (size_t k = i >= 6 ? i - 6 : 0; k < std::min(i + 4, std::min(a.events.size(), b.events.size())); ++k)
        ctx += "\n  " + std::to_string(k) + ": " + a.events[k] + "  |  " + b.events[k];
      return "event " + std::to_string(i) + ": cpu '" + x + "' vs meta '" + y + "'" + ctx;
    }
  }
  return "same events";
}

// Meta against cpu:0 for each combination, with 1 and 2 threads.
void check_combinations(const PlanWorkload& w, const std::vector<TechniqueOptions>& combos) {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const TechniqueOptions& t : combos) {
      INFO("threads " << threads << ", " << t.str());
      Trace cpu_trace(Device("cpu:0")), meta_trace(kMeta);
      const StepMemory cpu = measure_step(w, t, Device("cpu:0"), 2).memory;
      const size_t cpu_events = cpu_trace.events.size();
      const StepMemory meta = measure_step(w, t, kMeta, 2).memory;
      INFO("the meta step's events on cpu:0: " << cpu_trace.events.size() - cpu_events);
      CHECK(cpu_trace.events.size() == cpu_events);  // a meta step allocates nothing real
      // Not only the same peaks: the same allocations and frees, in the same order (a kernel
      // path that meta does not take can part from cpu's without moving a small shape's peak).
      CHECK(first_difference(cpu_trace, meta_trace) == "same events");
      CHECK(cpu.peak > 0);
      CHECK(meta.peak == cpu.peak);
      for (MemoryCategory k : kAllMemoryCategories) {
        INFO(category_name(k));
        CHECK(meta.category[size_t(k)] == cpu.category[size_t(k)]);
        CHECK(meta.at_peak[size_t(k)] == cpu.at_peak[size_t(k)]);
      }
    }
  }
  set_num_threads(saved);
}

// Every combination of the lists.
void check_grid(const PlanWorkload& w, const std::vector<std::string>& checkpoints,
                const std::vector<std::string>& precisions, const std::vector<int64_t>& micros,
                const std::vector<bool>& offloads) {
  std::vector<TechniqueOptions> combos;
  for (const auto& c : checkpoints)
    for (const auto& p : precisions)
      for (int64_t m : micros)
        for (bool off : offloads) combos.push_back(techniques(c, p, m, off));
  check_combinations(w, combos);
}

}  // namespace

TEST_CASE("meta step equals cpu: GPT with dropout, every checkpoint policy", "[meta][plan]") {
  check_grid(tiny_gpt(64, 16, 32, 2, 0.1, 4), {"none", "blocks", "every:2", "sqrt", "selective"}, {"fp32"}, {0}, {false});
}

TEST_CASE("meta step equals cpu: GPT precisions, micro-batches and offload", "[meta][plan]") {
  check_grid(tiny_gpt(64, 16, 32, 2, 0.1, 4), {"none", "blocks"}, {"bf16", "fp16", "bf16-pure"}, {0, 2}, {false, true});
}

TEST_CASE("meta step equals cpu: attention-heavy GPT (two key tiles)", "[meta][plan]") {
  check_grid(tiny_gpt(32, 80, 32, 4, 0.1, 2), {"none", "selective"}, {"fp32", "bf16"}, {0}, {false});
}

TEST_CASE("meta step equals cpu: logits-heavy GPT", "[meta][plan]") {
  check_grid(tiny_gpt(600, 16, 16, 2, 0.0, 3), {"none", "blocks"}, {"fp32", "bf16-pure"}, {0, 1}, {false});
}

TEST_CASE("meta step equals cpu: MobileNetV2", "[meta][plan]") {
  check_combinations(tiny_mobilenet(4), {techniques("none", "fp32", 0, false), techniques("blocks", "fp32", 0, false),
                                         techniques("sqrt", "bf16", 0, false), techniques("none", "fp16", 2, false),
                                         techniques("blocks", "bf16-pure", 2, false), techniques("none", "bf16", 0, true)});
}

// Blocks of 1 MiB and more (the large pool, where the best fit among equal sizes once followed
// the backend's addresses): a real workload.
TEST_CASE("meta step equals cpu: gpt-small with checkpointing", "[meta][plan][slow]") {
  check_combinations(PlanWorkload::named("gpt-small", 1), {techniques("blocks", "fp32", 0, false)});
}
