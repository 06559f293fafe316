// `memgrad bench`: runs one model under several combinations of memory techniques, each in a
// fresh state on the same data and seed, and tabulates what each costs and saves: peak allocated
// bytes per category and in total, peak reserved, the median step time, throughput, the loss
// after N steps, and every row's memory and time as a ratio to the `none` row. The table also
// goes to bench.csv and bench.html (bars of memory by category, a time axis) in the output folder.
// With --devices, combinations may split the model over those devices (split=, pipeline=) and
// the table, bench.csv and bench.html gain each device's peak.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/gpt_train.h"
#include "apps/model_parallel_options.h"
#include "apps/technique_options.h"
#include "apps/vision_train.h"

namespace mg {

// One combination: "none", or parts joined by '+': ckpt (= blocks), ckpt-sqrt, ckpt-every2,
// selective, bf16, fp16, bf16pure, accumN (micro-batch = batch / N), offload (saved activations
// to cpu:1, or cpu:0 from a GPU), and with --devices split=S (S: attention-mlp, stages:K,
// balanced, tensor: the model cut over `split_devices` as `--split S` does) and pipeline=gpipe|1f1b
// (needs a split into stages and accumN for its micro-batches), and adam8bit (AdamW with both
// moments in 8 bits, optim/adamw8bit.h, in place of the run's --optimizer adamw), and ddp=N,
// zero1=N, zero2=N (data parallel over N ranks, ZeRO stage 0, 1 or 2: bench runs such a row under
// `mpirun -np N ... --ddp` with the row's stage; memgrad plan simulates every rank, Note [Simulated
// ranks]). parse_combination throws naming the unknown or misplaced part.
struct Combination {
  std::string name;
  TechniqueOptions techniques;
  ModelParallelOptions parallel{};  // split= / pipeline=: over --devices; inactive otherwise
  std::optional<OptimizerKind> optimizer{};  // adam8bit: replaces the run's optimizer; none: the run's own
  int ranks = 0;                    // ddp=N / zeroS=N: N data-parallel ranks (0: not data parallel)
  int zero = 0;                     // and their ZeRO stage
  // The run's optimizer under this combination: `run`'s unless the combination names one. Throws
  // when adam8bit would replace SGD (it replaces AdamW's state, not another update rule).
  OptimizerKind optimizer_for(OptimizerKind run) const;
};
Combination parse_combination(const std::string& text, int64_t batch, const Device& device,
                              const std::vector<Device>& split_devices = {});
std::vector<Combination> parse_combinations(const std::string& list, int64_t batch, const Device& device,
                                            const std::vector<Device>& split_devices = {});

struct BenchOptions {
  std::string model = "gpt-mini";  // gpt-mini, gpt-small, gpt2-124m, mobilenetv2-32, mobilenetv2-224
  std::optional<GPTConfig> gpt{};                // tiny models for tests (instead of `model`)
  std::optional<MobileNetV2Config> mobilenet{};
  std::string techniques = "none,ckpt,bf16,ckpt+bf16,accum4,ckpt+bf16+accum4,offload";
  int64_t steps = 10;
  int64_t batch = 0;                // 0: the workload's (8 for GPT, 64 for MobileNetV2-32)
  std::string data{};               // "" = the default corpus / fashion-mnist
  std::string device = "cpu:0";
  std::vector<Device> devices{};    // --devices: what split= combinations cut the model over
  std::string out{};                // folder for bench.csv, bench.html and the runs ("" = runs/bench-<model>-<time>)
  uint64_t seed = 1;
  ProgressStyle progress = ProgressStyle::lines;
  // --ddp (under mpirun): every row trains data-parallel over the ranks (--batch is the global
  // batch); the table adds each rank's memory and the collectives' time, rank 0 writes the files.
  DataParallelOptions data_parallel{};
};

struct BenchRow {
  std::string name;
  TechniqueOptions techniques;
  ModelParallelOptions parallel{};  // split= / pipeline=
  StepMemory memory{};
  double ms_per_step = 0.0;
  double throughput = 0.0;  // tokens/s or images/s
  double loss = 0.0;        // the last step's
  int64_t micro_batch = 0;
  int64_t offloaded_bytes = 0;  // saved activations parked on the offload device (most in one step)
  std::vector<StepMemory> rank_memory{};  // --ddp: every rank's, in rank order
  // Each device's steady peaks (steps after the first): the split's devices, or the one device.
  std::vector<DevicePeak> device_peaks{};
  const DevicePeak* on(const Device& d) const;  // null when the row did not use d
  double comm_ms = 0.0, exposed_comm_ms = 0.0;  // --ddp: TrainResult's
};

struct BenchResult {
  std::string model, unit, out_dir;  // unit: "tok/s" or "img/s"
  int64_t steps = 0, batch = 0;
  std::vector<BenchRow> rows;
  // The row ratios are taken against: "none" when it ran, else the first.
  const BenchRow& baseline() const;
  std::string table() const;  // the printed table
  int world_size = 1;          // --ddp: the ranks
  // --devices: a peak column per device (--device first when the split does not use it); empty
  // without --devices, and the table and bench.csv are then as they were.
  std::vector<Device> device_columns{};
};

BenchResult run_bench(const BenchOptions& options);
// bench.csv and bench.html of a result into `dir`.
void write_bench_csv(const BenchResult& r, const std::string& path);
void write_bench_html(const BenchResult& r, const std::string& path);

}  // namespace mg
