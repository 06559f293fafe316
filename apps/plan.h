// `memgrad plan`: the memory of every candidate combination of techniques for a workload, exact,
// from one Trainer step per combination on the meta device (apps/plan_step.h), whether it fits a
// budget, its estimated step time (apps/cost_model.h), and the recommendation: the fastest
// combination that fits. The time estimate is FLOPs and bytes at this machine's calibrated
// rates (apps/cost_model.h), or, with `--calibrate steps`, built from timed micro-steps of the
// real model (apps/step_pieces.h). `--verify` also runs each candidate on the real device and
// sets the measured memory and time beside the estimates.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench.h"
#include "apps/collective_rates.h"
#include "apps/cost_model.h"
#include "apps/plan_step.h"
#include "apps/step_pieces.h"

namespace mg {

struct PlanOptions {
  std::string model = "gpt-mini";   // a name PlanWorkload::named knows
  int64_t batch = 0;                // 0: the workload's
  std::string device = "cpu:0";     // the device the run would train on
  std::vector<Device> devices{};    // --devices: what split= candidates cut the model over
  int ranks = 0;                    // --ranks: the default candidates add data parallelism over this many
  double bucket_mb = DataParallelOptions{}.bucket_mb;  // --bucket-mb: the data-parallel rows' gradient buckets
  // The budget: "512MiB" for every device, or per device, "cpu:0=200MiB,cpu:1=300MiB" (a device
  // not named has none); "": none, every candidate fits.
  std::string memory_limit{};
  std::string techniques{};         // bench's syntax; "": the default candidates (default_candidates)
  std::string optimizer = "adamw";  // adamw, adamw8bit or sgd
  std::optional<PlanWorkload> workload{};  // instead of model / batch (tiny models for tests)
  bool verify = false;              // also run every candidate on the device
  int64_t verify_steps = 3;         // steps per verified candidate (the first is warm-up)
  // --verify's time is the median over this many rounds; each round runs every candidate once,
  // in turn, so a burst of load from other processes slows all candidates alike. The first
  // round also measures the memory; later ones run 2 steps (warm-up + timed) each.
  int verify_rounds = 3;
  std::optional<Calibration> calibration{};  // the time model's rates (default: this machine's, cached)
  // "flops": FLOPs and bytes at the calibrated rates. "steps": the rows that fit are estimated
  // from timed micro-steps and updates (StepPieces; cached, the missing ones timed now in
  // calibrate_rounds interleaved rounds); rows that do not fit keep the FLOP estimate.
  std::string calibrate = "flops";
  int calibrate_rounds = 3;
  // "wall" or "cpu": what --calibrate steps and --verify time, wall-clock time or the process's
  // CPU time (steadier on a shared machine; Note [CPU time] in apps/plan_step.cpp).
  std::string clock = "wall";
  std::optional<StepPieces> pieces{};  // "steps": start from these instead of the cache (tests)
  // Collective rates measured by this job (mpirun -np N memgrad plan): rows of N ranks use them;
  // rows of other rank counts use the cached ones, else the stand-in (Note [Collective time]).
  std::optional<CollectiveRates> collectives{};
  // Every candidate placed by this map, over `devices` (which must be its devices): a running
  // split run's placement, which --auto-fit keeps while it changes the techniques. The
  // candidates then name no split or ranks of their own.
  std::optional<Placement> placement{};
};

struct PlanRow {
  Combination combination;
  StepMemory memory{};       // meta: exact, per category (a split: its fullest device's)
  // A split row: each device's memory (meta, named by the real devices) and what lives there.
  std::vector<StepMeasurement::DeviceMemory> devices{};
  // A data-parallel row (ddp=N, zeroS=N): every rank's memory (meta, a simulated group each), and
  // rank 0's collectives of one step with their estimated time (in estimated_ms).
  struct RankMemory {
    int rank = 0;
    StepMemory memory{};
  };
  std::vector<RankMemory> ranks{};
  ProcessGroup::Traffic traffic{};
  double comm_ms = 0.0;
  std::string comm_rates{};  // the measured rates comm_ms is at (CollectiveRates::str); "": the stand-in
  FlopCounts flops{};
  int64_t allocated_bytes = 0;
  double estimated_ms = 0.0;
  bool from_steps = false;   // estimated_ms from timed micro-steps (else from FLOPs and bytes)
  bool fits = true;
  // --verify: the same step run on the device.
  std::optional<StepMemory> measured{};
  std::vector<StepMeasurement::DeviceMemory> measured_devices{};  // a split row
  double measured_ms = 0.0;
  bool measured_fits = true;
};

struct Plan {
  PlanWorkload workload;
  Device device = kCPU;
  int64_t budget = 0;          // --device's budget (0: none): single-device and data-parallel rows
  MemoryLimits budgets{};      // every device's with a budget (--device and --devices)
  bool per_device = false;     // --memory-limit named devices (else one value for all)
  int64_t num_parameters = 0;
  Calibration calibration;
  std::optional<StepPieces> pieces{};  // --calibrate steps
  int calibrate_rounds = 0;
  int verify_rounds = 0;
  bool cpu_time = false;       // --clock cpu
  std::vector<PlanRow> rows;   // in candidate order
  int recommended = -1;        // index into rows; -1 when nothing fits
  double seconds = 0.0;        // wall-clock time the meta measurements took

  // The budget `d` has (0: none).
  int64_t budget_of(const Device& d) const { return limit_of(budgets, d); }
  // "none", "400.00 MiB" or "cpu:0 200.00 MiB, cpu:1 300.00 MiB".
  std::string budget_str() const;
  // Whether `r`'s bytes of category `c` (other: its peak) are under the budget on every device it
  // uses (a split: each device's own; else --device's).
  bool row_under_budget(const PlanRow& r, MemoryCategory c) const;
  std::string table() const;
  // "nothing fits <budget>: the least a candidate needs is ... (combination)" and what lowers it.
  std::string nothing_fits() const;
  nlohmann::json to_json() const;
};

// The candidates when --techniques is not given: every checkpoint policy (none, ckpt, ckpt-sqrt,
// selective) x precision (fp32, bf16, bf16pure) x accumulation (none, and 4 micro-batches, or 2
// when 4 does not divide the batch), plus offload on the plain and on the checkpointed fp32 runs.
std::string default_candidates(int64_t batch);
// With --devices, the default candidates add these splits over that many devices: balanced (plain,
// checkpointed, bf16), and for a GPT attention-mlp (2 devices) and tensor (when the heads divide).
std::string split_candidates(const PlanWorkload& w, size_t devices);
// With --ranks N, the default candidates add data parallelism over N ranks: ddp, zero1, zero2 and
// zero2 with checkpointing and with bf16 (bf16pure's bf16 gradients are not summed by DDP).
std::string rank_candidates(int ranks);

// Throws on a bad model, device, budget or technique (split= without --devices or that the model
// or devices do not allow, pipeline=, a split with offload, ranks that do not divide the batch);
// and when the budget is below what the parameters alone take, naming the least any candidate
// needs and what lowers it.
Plan make_plan(const PlanOptions& options);

}  // namespace mg
