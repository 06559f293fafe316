// Pipeline schedules: each stage's own sequence of steps, then a unit-time simulation that runs
// every stage's next step as soon as its inputs exist (forward (s, m) after forward (s-1, m);
// backward (s, m) after forward (s, m) and backward (s+1, m)), which orders them into one list.
#include "parallel/schedule.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace mg {

PipelineKind parse_pipeline(const std::string& s) {
  if (s == "gpipe") return PipelineKind::gpipe;
  if (s == "1f1b") return PipelineKind::one_f_one_b;
  MG_THROW("--pipeline '", s, "': unknown schedule (known: gpipe, 1f1b)");
}

std::string pipeline_name(PipelineKind k) { return k == PipelineKind::gpipe ? "gpipe" : "1f1b"; }

double PipelineSchedule::theoretical_bubble(int64_t p, int64_t m) { return double(p - 1) / double(m + p - 1); }

double PipelineSchedule::bubble_fraction() const {
  const double total = double(stages * slots);
  return total == 0 ? 0.0 : (total - double(steps.size())) / total;
}

std::string PipelineSchedule::str() const {
  std::string out = pipeline_name(kind) + " schedule, " + std::to_string(stages) + " stages x " +
                    std::to_string(micro_batches) + " micro-batches, " + std::to_string(slots) + " slots\n";
  std::vector<std::vector<std::string>> grid(static_cast<size_t>(stages), std::vector<std::string>(static_cast<size_t>(slots), "."));
  size_t width = 1;
  for (const auto& st : steps) {
    std::string cell(1, st.kind == PipelineStep::Kind::forward ? 'F' : 'B');
    cell += std::to_string(st.micro_batch);
    width = std::max(width, cell.size());
    grid[size_t(st.stage)][size_t(st.slot)] = cell;
  }
  for (int64_t s = 0; s < stages; ++s) {
    out += "  stage ";
    out += std::to_string(s);
    out += " |";
    for (const auto& cell : grid[size_t(s)]) out += " " + cell + std::string(width - cell.size(), ' ');
    out += "\n";
  }
  char buf[128];
  std::snprintf(buf, sizeof buf, "  bubble %.3f (theory (p-1)/(m+p-1) = %.3f)\n", bubble_fraction(),
                theoretical_bubble(stages, micro_batches));
  return out + buf;
}

PipelineSchedule make_schedule(PipelineKind kind, int64_t p, int64_t m) {
  MG_CHECK(p >= 1, "pipeline: the number of stages must be >= 1, got ", p);
  MG_CHECK(m >= 1, "pipeline: the number of micro-batches must be >= 1, got ", m,
           " (--pipeline needs --micro-batch smaller than the batch)");
  using K = PipelineStep::Kind;
  // Each stage's own order.
  std::vector<std::vector<PipelineStep>> seq(static_cast<size_t>(p));
  for (int64_t s = 0; s < p; ++s) {
    auto& q = seq[size_t(s)];
    auto f = [&](int64_t mb) { q.push_back({s, mb, K::forward, 0}); };
    auto b = [&](int64_t mb) { q.push_back({s, mb, K::backward, 0}); };
    if (kind == PipelineKind::gpipe) {
      for (int64_t i = 0; i < m; ++i) f(i);
      for (int64_t i = 0; i < m; ++i) b(i);
    } else {
      const int64_t warm = std::min(p - s - 1, m);
      for (int64_t i = 0; i < warm; ++i) f(i);
      for (int64_t i = 0; i < m - warm; ++i) {
        f(warm + i);
        b(i);
      }
      for (int64_t i = m - warm; i < m; ++i) b(i);
    }
  }
  // Unit-time simulation: a step may run in a slot when its inputs were finished in an earlier slot.
  std::vector<std::vector<int64_t>> fwd_done(static_cast<size_t>(p), std::vector<int64_t>(static_cast<size_t>(m), -1));
  std::vector<std::vector<int64_t>> bwd_done = fwd_done;
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  PipelineSchedule sched{kind, p, m, {}, 0};
  const size_t total = size_t(2 * p * m);
  for (int64_t slot = 0; sched.steps.size() < total; ++slot) {
    bool progress = false;
    for (int64_t s = 0; s < p; ++s) {
      if (next[size_t(s)] == seq[size_t(s)].size()) continue;
      PipelineStep st = seq[size_t(s)][next[size_t(s)]];
      const size_t mb = size_t(st.micro_batch);
      auto done_before = [&](int64_t when) { return when >= 0 && when < slot; };
      bool ready;
      if (st.kind == K::forward) ready = s == 0 || done_before(fwd_done[size_t(s - 1)][mb]);
      else ready = done_before(fwd_done[size_t(s)][mb]) && (s == p - 1 || done_before(bwd_done[size_t(s + 1)][mb]));
      if (!ready) continue;
      st.slot = slot;
      (st.kind == K::forward ? fwd_done : bwd_done)[size_t(s)][mb] = slot;
      sched.steps.push_back(st);
      ++next[size_t(s)];
      progress = true;
    }
    // Readiness only changes when a step finishes, so a slot in which nothing runs would repeat
    // forever: that is a deadlock (the sequences above never produce one).
    MG_INTERNAL_ASSERT(progress, "pipeline schedule deadlocked at slot ", slot);
    sched.slots = slot + 1;
  }
  return sched;
}

}  // namespace mg
