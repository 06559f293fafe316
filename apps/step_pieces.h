// The planner's measured time model (`memgrad plan --calibrate steps`). A training step is its
// micro-steps (forward + backward of one micro-batch, with the candidate's precision,
// checkpointing and activation offload, whose traffic happens inside them) and one update
// (clipping and the optimizer step). FLOPs at calibrated GEMM rates miss what this CPU actually
// spends on casts, 16-bit GEMM panels, non-GEMM ops, recomputation and small micro-batch GEMMs;
// timing the pieces on the real model does not. So each distinct "shape of work" among the
// candidates -- (checkpoint policy, precision, offload, micro-batch size) -- is timed once as a
// real Trainer step of one micro-batch, each precision's update is timed alone, and a candidate
// of n micro-batches is estimated as n x (its micro-step) + its update. A split candidate's
// micro-step is timed as the split step it is (the model placed over its devices, the copies
// between them included); its update is the same arithmetic as one device's. Pieces are cached per
// workload, CPU and thread count (steps-<threads>threads-<wall|cpu>.json beside the calibration), so a
// second plan of the same workload, under another budget, times nothing.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/plan_step.h"

namespace mg {

// A candidate's shape of work as the pieces see it: its techniques and, for a split row, its
// split over the real devices (balanced: with the budgets it is cut against).
struct PieceShape {
  TechniqueOptions techniques;
  ModelParallelOptions parallel{};
};

struct StepPieces {
  std::map<std::string, double> micro_ms;   // micro_key -> ms of one forward + backward
  std::map<std::string, double> update_ms;  // update_key -> ms of one clipped optimizer step
  int timed_now = 0;         // pieces measured by this process (the rest came from the cache)
  double seconds = 0.0;      // wall-clock time spent timing them
  std::string path{};        // the cache file ("" when none)
  // Times are the process's CPU time rather than wall-clock time (Note [CPU time] in
  // plan_step.cpp); each clock has its own cache file.
  bool cpu_time = false;

  // The keys: the workload (name, parameters, optimizer, clipping) and the piece's shape.
  static std::string micro_key(const PlanWorkload& w, const TechniqueOptions& t, const ModelParallelOptions& parallel = {});
  static std::string update_key(const PlanWorkload& w, Precision p);
  // n x micro-step + update for a candidate; nullopt when a piece is missing.
  std::optional<double> estimate_ms(const PlanWorkload& w, const TechniqueOptions& t,
                                    const ModelParallelOptions& parallel = {}) const;

  // The cached pieces of this CPU and thread count (none when missing or unreadable), and
  // writing them back (atomically; a failure to write leaves path empty).
  static StepPieces cached(bool cpu_time);
  void save();
};

// Times the pieces of `candidates` that `pieces` lacks, on `device`, and adds them. Each round
// runs every missing micro-step shape once (a fresh model: a warm-up step, then one timed step
// of one micro-batch), so a burst of load from other processes slows all shapes alike; a piece
// is the median over `rounds` rounds, less its precision's update (timed alone, median of 5).
// The clock is pieces.cpu_time's.
void measure_step_pieces(const PlanWorkload& w, const std::vector<PieceShape>& candidates,
                         const Device& device, int rounds, StepPieces& pieces);

}  // namespace mg
