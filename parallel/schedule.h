// Pipeline schedules over micro-batches: a static list of (stage, micro-batch, forward|backward)
// steps computed up front. GPipe runs every forward, then every backward; 1F1B (PipeDream-Flush)
// runs p - s - 1 warm-up forwards on stage s, then alternates one forward and one backward, then
// drains the backwards, so a stage holds at most p micro-batches' activations instead of m.
// Backwards go in micro-batch order on every stage (so gradients accumulate in the order of a
// plain micro-batched run). The list is built by simulating unit-time slots, which proves it
// deadlock-free and gives the schedule's bubble fraction.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mg {

enum class PipelineKind { gpipe, one_f_one_b };
PipelineKind parse_pipeline(const std::string& s);  // "gpipe", "1f1b"
std::string pipeline_name(PipelineKind k);

struct PipelineStep {
  enum class Kind { forward, backward };
  int64_t stage = 0;
  int64_t micro_batch = 0;
  Kind kind = Kind::forward;
  int64_t slot = 0;  // the unit-time slot the simulation ran it in (stages in one slot overlap)
  bool operator==(const PipelineStep&) const = default;
};

struct PipelineSchedule {
  PipelineKind kind;
  int64_t stages = 0, micro_batches = 0;
  std::vector<PipelineStep> steps;  // in slot order (stage order within a slot): an executable order
  int64_t slots = 0;                // the makespan in unit slots (forward = backward = 1)

  // Idle stage-slots over all stage-slots; with equal forward and backward costs both schedules
  // give (p - 1) / (m + p - 1).
  double bubble_fraction() const;
  static double theoretical_bubble(int64_t stages, int64_t micro_batches);
  // One line per stage ("stage 0 | F0 F1 .. B0 ..", '.' for idle slots) and the bubble.
  std::string str() const;
};

// Errors: stages or micro-batches below 1.
PipelineSchedule make_schedule(PipelineKind kind, int64_t stages, int64_t micro_batches);

}  // namespace mg
