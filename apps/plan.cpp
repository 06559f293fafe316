// memgrad plan (see plan.h): the candidates, their meta measurements, the budget check, the
// ranking, the table and the JSON rows.
#include "apps/plan.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"

namespace mg {

namespace {

double mib(int64_t b) { return double(b) / (1024.0 * 1024.0); }

// The least parameter bytes any row holds (bf16pure halves them), and that row.
const PlanRow& least(const std::vector<PlanRow>& rows, MemoryCategory c) {
  const PlanRow* best = &rows.front();
  for (const PlanRow& r : rows)
    if ((c == MemoryCategory::other ? r.memory.peak : r.memory.category[size_t(c)]) <
        (c == MemoryCategory::other ? best->memory.peak : best->memory.category[size_t(c)]))
      best = &r;
  return *best;
}

// The workload a candidate trains: the plan's, with the combination's optimizer (adam8bit).
PlanWorkload workload_of(const PlanWorkload& w, const Combination& c) {
  PlanWorkload out = w;
  out.optimizer = c.optimizer_for(w.optimizer);
  return out;
}

// Note [Splits on meta]: a split row runs on meta devices in place of its real ones, meta:8,
// meta:9, ... by position in --devices (the model built on the one standing for --device, or on
// meta:0 when the split does not use it). --split balanced searches its cuts on meta:1..K
// (measure_on_meta) while the model is being placed, so the row's own devices start above them.
constexpr int kFirstSplitMeta = 8;
// Data-parallel rows simulate every rank, one meta step each.
constexpr int kMaxPlannedRanks = 64;

// The budgets a row's step runs under, on its real devices: a split's devices each their own,
// one device (or each rank of a data-parallel row) --device's.
MemoryLimits row_budgets(const Combination& c, const Device& device, const MemoryLimits& budgets) {
  MemoryLimits out;
  for (const auto& [d, bytes] : budgets) {
    const bool used = c.parallel.active() ? std::find(c.parallel.devices.begin(), c.parallel.devices.end(), d) !=
                                                c.parallel.devices.end()
                                          : d == device;
    if (used && bytes > 0) out.emplace_back(d, bytes);
  }
  return out;
}

// A split row's split as its run trains it: balanced cut against the row's budgets when every
// device has one (as place_model cuts a run under them), so a step without the budgets (the
// plan's first measurement, a timed piece) places the same blocks.
ModelParallelOptions split_of(const Combination& c, const Device& device, const MemoryLimits& budgets) {
  ModelParallelOptions out = c.parallel;
  const MemoryLimits mine = row_budgets(c, device, budgets);
  if (c.parallel.active() && mine.size() == c.parallel.devices.size() && out.balance_budgets.empty())
    for (const Device& d : c.parallel.devices) out.balance_budgets.push_back(limit_of(mine, d));
  return out;
}

struct OnMeta {
  Device home;                    // where the model is built
  ModelParallelOptions parallel;  // the split over meta devices (inactive: one device)
  MemoryLimits limits;            // the row's budgets on the meta devices standing in
};
OnMeta on_meta(const Combination& c, const Device& device, const MemoryLimits& budgets) {
  OnMeta m{.home = Device(DeviceType::meta, 0), .parallel = split_of(c, device, budgets), .limits = {}};
  for (size_t i = 0; i < c.parallel.devices.size(); ++i) {
    const Device d(DeviceType::meta, kFirstSplitMeta + int(i));
    if (c.parallel.devices[i] == device) m.home = d;
    m.parallel.devices[i] = d;
  }
  if (m.parallel.placement)  // a fixed map: its devices by their meta stand-ins too
    for (auto& [path, d] : m.parallel.placement->entries) {
      const auto at = std::find(c.parallel.devices.begin(), c.parallel.devices.end(), d);
      MG_INTERNAL_ASSERT(at != c.parallel.devices.end(), "a placement device outside the plan's devices");
      d = m.parallel.devices[size_t(at - c.parallel.devices.begin())];
    }
  for (const auto& [d, bytes] : row_budgets(c, device, budgets)) {
    if (!c.parallel.active()) {
      m.limits.emplace_back(m.home, bytes);
      continue;
    }
    const size_t i = size_t(std::find(c.parallel.devices.begin(), c.parallel.devices.end(), d) - c.parallel.devices.begin());
    m.limits.emplace_back(m.parallel.devices[i], bytes);
  }
  return m;
}
// A split row's devices under their real names (meta:8 -> the first of --devices, ...).
std::vector<StepMeasurement::DeviceMemory> named_devices(const Combination& c, std::vector<StepMeasurement::DeviceMemory> d) {
  if (!c.parallel.active()) return {};
  for (size_t i = 0; i < d.size(); ++i) d[i].device = c.parallel.devices[size_t(d[i].device.index - kFirstSplitMeta)];
  return d;
}

// A data-parallel row's rank `rank`: a simulated group (Note [Simulated ranks]) in the row's
// ZeRO stage; inactive for other rows.
DataParallelOptions simulated_rank(const Combination& c, int rank, double bucket_mb) {
  DataParallelOptions d;
  if (c.ranks == 0) return d;
  d.enabled = true;
  d.zero = c.zero;
  d.bucket_mb = bucket_mb;
  d.group = ProcessGroup::simulated(rank, c.ranks);
  return d;
}

// A row's step on meta (a data-parallel row: rank `rank`'s); a split's errors (a split the model
// does not allow) name the real devices and the combination, not the meta devices standing in.
// `budgets`: the real devices'; the step runs under them when `bounded` (balanced cuts by them either way).
StepMeasurement measure_on_meta(const PlanWorkload& w, const Combination& c, const Device& device, int steps,
                                const MemoryLimits& budgets, bool bounded, int rank, double bucket_mb) {
  const OnMeta meta = on_meta(c, device, budgets);
  try {
    return measure_step(workload_of(w, c), c.techniques, meta.home, steps, bounded ? meta.limits : MemoryLimits{},
                        meta.parallel, simulated_rank(c, rank, bucket_mb));
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const Error& e) {
    if (!c.parallel.active()) throw;
    std::string msg = e.what();
    for (size_t i = c.parallel.devices.size(); i-- > 0;) {
      const std::string from = Device(DeviceType::meta, kFirstSplitMeta + int(i)).str();
      for (size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at))
        msg.replace(at, from.size(), c.parallel.devices[i].str());
    }
    MG_THROW("plan: '", c.name, "': ", msg);
  }
}

// Whether a candidate runs under its budgets (each device of a split under its own): the allocator
// caps reserved bytes, and a step whose reserved peak passes a budget may still fit once cached
// segments are released, so that case is decided by running the step on meta under the budgets.
// That run's memory then replaces `m`'s (unbounded, on the meta devices): under pressure the
// allocator releases and cuts its blocks otherwise, so it is what a run under these budgets allocates.
bool fits_budget(const PlanWorkload& w, const Combination& c, const Device& device, int steps,
                 const MemoryLimits& budgets, int rank, double bucket_mb, StepMeasurement& m) {
  const MemoryLimits limits = on_meta(c, device, budgets).limits;
  bool all_reserved = true, any_peak = false;
  for (const auto& d : m.devices) {
    const int64_t budget = limit_of(limits, d.device);
    if (budget <= 0) continue;
    all_reserved = all_reserved && d.memory.reserved <= budget;
    any_peak = any_peak || d.memory.peak > budget;
  }
  if (all_reserved) return true;
  if (any_peak) return false;
  try {
    m = measure_on_meta(w, c, device, steps, budgets, true, rank, bucket_mb);
    return true;
  } catch (const OutOfMemoryError&) {
    return false;
  }
}

// --calibrate steps: the rows that fit (all without a budget) get n x micro-step + update from
// timed pieces; the ones that do not fit cannot be recommended and keep the FLOP estimate. A split
// row's micro-steps are timed as that split step; a data-parallel row's estimate is one rank's:
// the micro-steps of its 1/N of the batch, the update (1/N of it under ZeRO, where each rank steps
// its shard of the parameters) and the collectives' stand-in (Note [Collective time]), which
// one process cannot time.
void estimate_from_steps(Plan& p, const PlanOptions& o) {
  auto rank_workload = [&](const PlanRow& r) {
    PlanWorkload w = workload_of(p.workload, r.combination);
    if (r.combination.ranks > 0) w.batch /= r.combination.ranks;
    return w;
  };
  // The pieces are keyed by the workload's optimizer and batch (a rank's shard) too: each
  // optimizer among the rows (the run's, adam8bit's) and each rank count times its own.
  std::map<std::pair<OptimizerKind, int64_t>, std::vector<PieceShape>> shapes;
  for (const PlanRow& r : p.rows)
    if (r.fits)
      shapes[{r.combination.optimizer_for(p.workload.optimizer), rank_workload(r).batch}].push_back(
          {.techniques = r.combination.techniques, .parallel = split_of(r.combination, p.device, p.budgets)});
  StepPieces pieces = o.pieces ? *o.pieces : StepPieces::cached(p.cpu_time);
  pieces.cpu_time = p.cpu_time;
  for (const auto& [kind_batch, of_kind] : shapes) {
    PlanWorkload w = p.workload;
    w.optimizer = kind_batch.first;
    w.batch = kind_batch.second;
    measure_step_pieces(w, of_kind, p.device, o.calibrate_rounds, pieces);
  }
  if (!o.pieces && pieces.timed_now > 0) pieces.save();
  for (PlanRow& r : p.rows) {
    if (!r.fits) continue;
    const PlanWorkload w = rank_workload(r);
    const TechniqueOptions& t = r.combination.techniques;
    r.estimated_ms = pieces.estimate_ms(w, t, split_of(r.combination, p.device, p.budgets)).value();
    if (r.combination.zero > 0) {  // ZeRO: each rank updates its 1/N of the parameters
      const double update = pieces.update_ms.at(StepPieces::update_key(w, t.precision));
      r.estimated_ms -= update * (1.0 - 1.0 / double(r.combination.ranks));
    }
    r.estimated_ms += r.comm_ms;
    r.from_steps = true;
  }
  p.pieces = pieces;
  p.calibrate_rounds = o.calibrate_rounds;
}

// --verify: the memory from the first round (verify_steps steps under the budget), the time the
// median of every timed step over all rounds, the candidates interleaved round by round.
void verify(Plan& p, const PlanOptions& o) {
  std::vector<std::vector<double>> times(p.rows.size());
  for (int round = 0; round < o.verify_rounds; ++round)
    for (size_t i = 0; i < p.rows.size(); ++i) {
      PlanRow& row = p.rows[i];
      if (!row.measured_fits || row.combination.ranks > 0) continue;  // ranks: mpirun ... memgrad bench --ddp
      try {
        const StepMeasurement m = measure_step(workload_of(p.workload, row.combination), row.combination.techniques, p.device,
                                               round == 0 ? int(o.verify_steps) : 2,
                                               row_budgets(row.combination, p.device, p.budgets), row.combination.parallel);
        if (round == 0) {
          row.measured = m.memory;
          if (row.combination.parallel.active()) row.measured_devices = m.devices;
        }
        const std::vector<double>& t = p.cpu_time ? m.timed_cpu_ms : m.timed_ms;
        times[i].insert(times[i].end(), t.begin(), t.end());
      } catch (const OutOfMemoryError&) {
        row.measured_fits = false;
      }
    }
  for (size_t i = 0; i < p.rows.size(); ++i) {
    std::vector<double>& t = times[i];
    if (t.empty()) continue;
    std::sort(t.begin(), t.end());
    p.rows[i].measured_ms = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
  }
  p.verify_rounds = o.verify_rounds;
}

// Note [Collective time]: a data-parallel row's collectives cost the bytes a rank sends in a ring
// (ring_bytes_sent: an all-reduce of n bytes sends 2 (N - 1) / N n, a reduce-scatter of n or an
// all-gather into n (N - 1) / N n, a broadcast n), none of it hidden behind backward, at the rates
// measured on N real ranks (CollectiveRates: `mpirun -np N memgrad plan`, then cached). Without
// them, a stand-in: each byte charged as a copy at the calibrated main-memory bandwidth (the
// largest working set); ranks sharing this machine's cores measured far longer (docs/PLAN.md,
// "Data-parallel ranks"), and another interconnect (NCCL over NVLink, a network) has other rates.
double collective_ms(const ProcessGroup::Traffic& t, int ranks, double gbytes_per_s) {
  const ProcessGroup::Traffic s = ring_bytes_sent(t, ranks);
  const double sent = double(s.all_reduce + s.reduce_scatter + s.all_gather + s.broadcast);
  return 1e3 * 2.0 * sent / (gbytes_per_s * 1e9);
}

// The measured rates for a row of `ranks` ranks: this job's (mpirun -np N), else the cached ones.
std::optional<CollectiveRates> collective_rates_for(const PlanOptions& o, int ranks) {
  if (ranks == 0) return std::nullopt;
  if (o.collectives && o.collectives->ranks == ranks && o.collectives->bucket_mb == o.bucket_mb) return o.collectives;
  return CollectiveRates::cached(ranks, o.bucket_mb);
}

}  // namespace

std::string default_candidates(int64_t batch) {
  // Accumulation over 4 micro-batches (2 when 4 does not divide the batch): 26 candidates keep a
  // plan of gpt2-124m under 2 s; --techniques asks for others (accum8, fp16, ...).
  std::vector<std::string> accums{""};
  if (batch % 4 == 0) accums.push_back("accum4");
  else if (batch % 2 == 0) accums.push_back("accum2");
  std::string list;
  auto add = [&](std::vector<std::string> parts) {
    std::string name;
    for (const auto& p : parts)
      if (!p.empty()) name += (name.empty() ? "" : "+") + p;
    if (!list.empty()) list += ',';
    list += name.empty() ? "none" : name;
  };
  for (const char* ckpt : {"", "ckpt", "ckpt-sqrt", "selective"})
    for (const char* prec : {"", "bf16", "bf16pure"})
      for (const auto& acc : accums) add({ckpt, prec, acc});
  add({"offload"});
  add({"ckpt", "offload"});
  return list;
}

std::string split_candidates(const PlanWorkload& w, size_t devices) {
  std::string list = "split=balanced,ckpt+split=balanced,bf16+split=balanced";
  if (w.is_gpt() && devices == 2) list += ",split=attention-mlp";
  if (w.is_gpt() && w.gpt->n_head % int64_t(devices) == 0) list += ",split=tensor";
  return list;
}

std::string rank_candidates(int ranks) {
  const std::string n = std::to_string(ranks);
  return "ddp=" + n + ",zero1=" + n + ",zero2=" + n + ",ckpt+zero2=" + n + ",bf16+zero2=" + n;
}

Plan make_plan(const PlanOptions& o) {
  Plan p;
  p.workload = o.workload ? *o.workload : PlanWorkload::named(o.model, o.batch);
  p.workload.optimizer = parse_optimizer_kind(o.optimizer);
  p.device = Device(o.device);
  MG_CHECK(p.device.is_cpu(), "plan: --device ", p.device.str(),
           ": plans are for cpu:N for now (the meta step models the CPU kernels' workspace, not cuBLAS's, cuDNN's "
           "or the CUDA flash kernels' row sums, none of it checked on a GPU yet, and the time model is calibrated "
           "on this machine's CPU)");
  MG_CHECK(o.verify_steps >= 2, "plan: --verify-steps must be at least 2 (the first is warm-up), got ", o.verify_steps);
  MG_CHECK(o.verify_rounds >= 1, "plan: --verify-rounds must be at least 1, got ", o.verify_rounds);
  MG_CHECK(o.calibrate == "flops" || o.calibrate == "steps", "plan: --calibrate must be flops or steps, got '",
           o.calibrate, "'");
  MG_CHECK(o.clock == "wall" || o.clock == "cpu", "plan: --clock must be wall or cpu, got '", o.clock, "'");
  p.cpu_time = o.clock == "cpu";
  {
    std::vector<Device> budgeted{p.device};  // --device and --devices: the devices a budget may name
    for (const Device& d : o.devices)
      if (std::find(budgeted.begin(), budgeted.end(), d) == budgeted.end()) budgeted.push_back(d);
    try {
      p.budgets = parse_memory_limits(o.memory_limit, budgeted);
    } catch (const Error& e) {
      MG_THROW("plan: ", e.what(), " (the devices of this plan: --device and --devices)");
    }
    p.per_device = o.memory_limit.find('=') != std::string::npos;
    for (const auto& [d, bytes] : p.budgets)
      MG_CHECK(bytes > 0, "plan: --memory-limit must be positive, got '", o.memory_limit, "'");
    p.budget = p.budget_of(p.device);
  }
  p.num_parameters = p.workload.num_parameters();
  for (const Device& d : o.devices)
    MG_CHECK(d.is_cpu(), "plan: --devices ", d.str(), ": plans are for cpu:N for now, as --device");
  MG_CHECK(o.devices.size() < size_t(kMaxDevicesPerType - kFirstSplitMeta), "plan: --devices takes at most ",
           kMaxDevicesPerType - kFirstSplitMeta - 1, " devices, got ", o.devices.size());
  MG_CHECK(o.bucket_mb > 0, "plan: --bucket-mb must be positive, got ", o.bucket_mb);
  MG_CHECK(o.ranks >= 0 && o.ranks <= kMaxPlannedRanks, "plan: --ranks must be between 1 and ", kMaxPlannedRanks,
           " (0: no data-parallel rows), got ", o.ranks);
  MG_CHECK(o.ranks == 0 || o.techniques.empty(), "plan: --ranks adds data-parallel rows to the default candidates; with "
           "--techniques name them there (ddp=", o.ranks, ", zero1=", o.ranks, ", zero2=", o.ranks, ")");
  std::vector<Combination> combos =
      parse_combinations(o.techniques.empty() ? default_candidates(p.workload.batch) +
                                                    (o.devices.empty() ? "" : "," + split_candidates(p.workload, o.devices.size())) +
                                                    (o.ranks ? "," + rank_candidates(o.ranks) : "")
                                              : o.techniques,
                         p.workload.batch, p.device, o.placement ? std::vector<Device>{} : o.devices);
  if (o.placement) {
    MG_CHECK(o.placement->devices() == o.devices, "plan: a fixed placement must be over --devices (",
             o.placement->str(), ")");
    for (Combination& c : combos) {
      MG_CHECK(!c.parallel.active() && c.ranks == 0, "plan: '", c.name,
               "': the candidates of a fixed placement name no split or ranks of their own");
      c.parallel.placement = *o.placement;
      c.parallel.devices = o.devices;
    }
  }
  for (const Combination& c : combos) {
    MG_CHECK(c.ranks <= kMaxPlannedRanks, "plan: '", c.name, "': at most ", kMaxPlannedRanks, " ranks are planned (each "
             "is simulated), got ", c.ranks);
    MG_CHECK(!c.parallel.pipeline, "plan: '", c.name, "': pipelined splits are not planned yet (plan split=stages:K "
             "without pipeline=; memgrad bench measures pipelines)");
    MG_CHECK(!(c.parallel.active() && c.techniques.offload_activations), "plan: '", c.name,
             "': a split model does not offload activations");
  }
  p.calibration = o.calibration ? *o.calibration : Calibration::of_this_machine();
  const auto t0 = std::chrono::steady_clock::now();
  for (const Combination& c : combos) {
    PlanRow row{.combination = c};
    // --verify runs the device for verify_steps: the meta step then runs as many (Note [Steady state]).
    const int steps = o.verify ? int(o.verify_steps) : kUntilSteady;
    // A data-parallel row: every rank simulated in turn; the row is its fullest rank, it fits when
    // every rank does, and its time is rank 0's step plus its collectives (Note [Collective time]).
    for (int rank = 0; rank < std::max(1, c.ranks); ++rank) {
      StepMeasurement m = measure_on_meta(p.workload, c, p.device, steps, p.budgets, false, rank, o.bucket_mb);
      const bool fits = fits_budget(p.workload, c, p.device, steps, p.budgets, rank, o.bucket_mb, m);
      row.fits = rank == 0 ? fits : row.fits && fits;
      if (c.ranks > 0) row.ranks.push_back({.rank = rank, .memory = m.memory});
      if (rank == 0 || m.memory.peak > row.memory.peak) row.memory = m.memory;
      if (rank > 0) continue;
      row.devices = named_devices(c, m.devices);
      row.flops = m.flops;
      row.allocated_bytes = m.allocated_bytes;
      row.traffic = m.traffic;
      const std::optional<CollectiveRates> rates = collective_rates_for(o, c.ranks);
      row.comm_ms = rates ? rates->ms(m.traffic) : collective_ms(m.traffic, c.ranks, p.calibration.bandwidth.back().gbytes_per_s);
      if (rates) row.comm_rates = rates->str();
      row.estimated_ms = p.calibration.estimate_ms(m.flops) + row.comm_ms;
    }
    p.rows.push_back(row);
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Budgets below the parameters alone (on some device of every row): no technique here gets there.
  const PlanRow& fewest_params = least(p.rows, MemoryCategory::parameter);
  const int64_t params = fewest_params.memory.category[size_t(MemoryCategory::parameter)];
  if (!p.budgets.empty() && std::none_of(p.rows.begin(), p.rows.end(), [&](const PlanRow& r) {
        return p.row_under_budget(r, MemoryCategory::parameter);
      })) {
    const PlanRow& smallest = least(p.rows, MemoryCategory::other);
    MG_THROW("plan: --memory-limit ", p.budget_str(), " is below the parameters alone (",
             format_bytes(params), " in ", fewest_params.combination.name, " for ", p.num_parameters,
             " parameters); the least any candidate needs is ", format_bytes(smallest.memory.peak), " (",
             smallest.combination.name, ")\n  hint: bf16pure stores the parameters in 2 bytes instead of 4; "
             "--optimizer adamw8bit or sgd shrinks the optimizer state; a smaller --batch or model lowers the rest");
  }
  if (o.calibrate == "steps") estimate_from_steps(p, o);
  for (size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].fits && (p.recommended < 0 || p.rows[i].estimated_ms < p.rows[size_t(p.recommended)].estimated_ms))
      p.recommended = int(i);
  if (o.verify) verify(p, o);
  return p;
}

std::string Plan::table() const {
  std::ostringstream os;
  char line[2048];
  const bool gpt = workload.is_gpt();
  std::snprintf(line, sizeof line, "memgrad plan: %s (%lld parameters), batch %lld%s, on %s, budget %s, optimizer %s\n",
                workload.name.c_str(), (long long)num_parameters, (long long)workload.batch,
                gpt ? (" x " + std::to_string(workload.gpt->context) + " tokens").c_str() : " images",
                device.str().c_str(), budget_str().c_str(),
                optimizer_kind_name(workload.optimizer).c_str());
  os << line;
  std::snprintf(line, sizeof line,
                "memory: peak allocated MiB per category of one training step per combination, run on meta (exact "
                "for %s; %zu combinations in %.0f ms)\n",
                device.str().c_str(), rows.size(), 1e3 * seconds);
  os << line;
  if (pieces) {
    std::snprintf(line, sizeof line,
                  "time: est ms of the rows that fit (est from: steps) = micro-batches x the measured ms of one "
                  "micro-step of the real model in that shape (precision, checkpointing, offload, micro-batch; a split "
                  "row's timed as that split step) + the measured update (a data-parallel row: one rank's 1/N of the "
                  "batch, 1/N of the update under ZeRO, + its collectives as below) (%s; %zu micro-step and %zu update pieces: %d timed now in %.1f s, median of "
                  "%d interleaved rounds; the rest cached in %s); rows that do not fit: (est from: flops) as below\n",
                  cpu_time ? "the process's CPU time" : "wall-clock", pieces->micro_ms.size(),
                  pieces->update_ms.size(), pieces->timed_now, pieces->seconds,
                  calibrate_rounds, pieces->path.empty() ? "nowhere" : pieces->path.c_str());
    os << line;
  }
  os << "time: " << (pieces ? "(est from: flops)" : "estimated") << " ms/step = the step's FLOPs, and its created "
     << "tensors' elements as f32 bytes at the element-wise bandwidth of their reuse distance, at this machine's "
     << "measured rates (" << calibration.str()
     << (calibration.cached ? "; cached in " : "; measured now, cached in ")
     << (calibration.path.empty() ? std::string("nowhere") : calibration.path) << ")\n";
  const bool verified = std::any_of(rows.begin(), rows.end(), [](const PlanRow& r) { return r.measured || !r.measured_fits; });
  std::snprintf(line, sizeof line, "%-26s %9s %9s %9s %9s %9s %9s %10s %10s %5s %10s %6s", "combination", "param",
                "grad", "optim", "activ", "work", "input", "peak", "reserved", "fits", "est ms", "from");
  os << line << (verified ? "  measured peak  measured ms   est/meas" : "") << "\n";
  if (std::any_of(rows.begin(), rows.end(), [](const PlanRow& r) { return !r.devices.empty(); }))
    os << "split rows: the row is its fullest device; each device's own peaks follow it (what it holds at the end; "
          "'fits': every device under the budget; est ms: the whole step's work, the devices in turn)\n";
  if (std::any_of(rows.begin(), rows.end(), [](const PlanRow& r) { return !r.ranks.empty(); }))
    os << "data-parallel rows (ddp=N, zeroS=N): the row is its fullest rank, each rank on a device of its own with "
          "its 1/N of the batch; each rank's peaks follow it (a simulated group each); 'fits': every rank under the "
          "budget; est ms: one rank's step plus its collectives' ring bytes at the rates measured under mpirun -np N "
          "(else at the copy bandwidth, a stand-in), none hidden; --verify "
          "does not run them: mpirun -np N memgrad bench --ddp --techniques NAME does\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const PlanRow& r = rows[i];
    auto cat = [&](MemoryCategory k) { return mib(r.memory.category[size_t(k)]); };
    std::snprintf(line, sizeof line, "%-26s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f %5s %10.1f %6s",
                  (r.combination.name + (int(i) == recommended ? " *" : "")).c_str(), cat(MemoryCategory::parameter),
                  cat(MemoryCategory::gradient), cat(MemoryCategory::optimizer_state), cat(MemoryCategory::activation),
                  cat(MemoryCategory::workspace), cat(MemoryCategory::input), mib(r.memory.peak), mib(r.memory.reserved),
                  r.fits ? "yes" : "no", r.estimated_ms, r.from_steps ? "steps" : "flops");
    os << line;
    if (r.measured) {
      std::snprintf(line, sizeof line, "  %10.2f %s %11.1f %9.2fx", mib(r.measured->peak),
                    r.measured->peak == r.memory.peak ? "=" : "!", r.measured_ms,
                    r.measured_ms > 0 ? r.estimated_ms / r.measured_ms : 0.0);
      os << line;
    } else if (!r.measured_fits) {
      os << "  out of memory";
    }
    os << "\n";
    for (size_t k = 0; k < r.devices.size(); ++k) {  // a split row: each device's own peaks
      const StepMeasurement::DeviceMemory& d = r.devices[k];
      auto dcat = [&](MemoryCategory c) { return mib(d.memory.category[size_t(c)]); };
      std::snprintf(line, sizeof line, "  %-24s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f", d.device.str().c_str(),
                    dcat(MemoryCategory::parameter), dcat(MemoryCategory::gradient),
                    dcat(MemoryCategory::optimizer_state), dcat(MemoryCategory::activation),
                    dcat(MemoryCategory::workspace), dcat(MemoryCategory::input), mib(d.memory.peak),
                    mib(d.memory.reserved));
      os << line;
      if (k < r.measured_devices.size()) {
        const int64_t measured = r.measured_devices[k].memory.peak;
        std::snprintf(line, sizeof line, "  %5s %10s %6s  %10.2f %s", "", "", "", mib(measured),
                      measured == d.memory.peak ? "=" : "!");
        os << line;
      }
      os << "  holds " << d.modules;
      if (per_device) os << (budget_of(d.device) > 0 ? "; budget " + format_bytes(budget_of(d.device)) : "; no budget");
      os << "\n";
    }
    for (const PlanRow::RankMemory& k : r.ranks) {  // a data-parallel row: each rank's own peaks
      auto kcat = [&](MemoryCategory c) { return mib(k.memory.category[size_t(c)]); };
      std::snprintf(line, sizeof line, "  rank %-19d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f", k.rank,
                    kcat(MemoryCategory::parameter), kcat(MemoryCategory::gradient),
                    kcat(MemoryCategory::optimizer_state), kcat(MemoryCategory::activation),
                    kcat(MemoryCategory::workspace), kcat(MemoryCategory::input), mib(k.memory.peak),
                    mib(k.memory.reserved));
      os << line;
      if (k.rank == 0) {
        const ProcessGroup::Traffic& t = r.traffic;
        std::snprintf(line, sizeof line, "  collectives per step: all-reduce %.2f, reduce-scatter %.2f, all-gather %.2f, "
                      "broadcast %.2f MiB; %.1f ms of the estimate", mib(t.all_reduce), mib(t.reduce_scatter),
                      mib(t.all_gather), mib(t.broadcast), r.comm_ms);
        os << line << (r.comm_rates.empty() ? " (stand-in: the copy bandwidth)" : " (measured: " + r.comm_rates + ")");
      }
      os << "\n";
    }
  }
  if (recommended >= 0) {
    const PlanRow& r = rows[size_t(recommended)];
    std::snprintf(line, sizeof line, "recommended (*): %s, peak %s, estimated %.1f ms/step (%s)\n",
                  r.combination.name.c_str(), format_bytes(r.memory.peak).c_str(), r.estimated_ms,
                  budgets.empty() ? "the fastest estimate; no budget given" : "the fastest estimate that fits the budget");
    os << line;
  } else {
    os << nothing_fits() << "\n";
  }
  if (verified && recommended >= 0) {
    int fastest = -1;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].measured && (fastest < 0 || rows[i].measured_ms < rows[size_t(fastest)].measured_ms)) fastest = int(i);
    const PlanRow& r = rows[size_t(recommended)];
    if (fastest >= 0 && r.measured) {
      std::snprintf(line, sizeof line, "verify: the fastest measured combination that fits is %s (%.1f ms); the "
                    "recommended one measured %.1f ms (%.2fx); times: %s, medians over %d interleaved rounds\n",
                    rows[size_t(fastest)].combination.name.c_str(), rows[size_t(fastest)].measured_ms, r.measured_ms,
                    r.measured_ms / rows[size_t(fastest)].measured_ms,
                    cpu_time ? "the process's CPU time" : "wall-clock", verify_rounds);
      os << line;
    }
  }
  return os.str();
}

std::string Plan::budget_str() const {
  if (budgets.empty()) return "none";
  if (!per_device) return format_bytes(budgets.front().second);
  std::string s;
  for (const auto& [d, bytes] : budgets) {
    if (!s.empty()) s += ", ";
    s += d.str() + ' ' + format_bytes(bytes);
  }
  return s;
}

bool Plan::row_under_budget(const PlanRow& r, MemoryCategory c) const {
  auto under = [&](const Device& d, const StepMemory& m) {
    const int64_t b = budget_of(d);
    return b <= 0 || (c == MemoryCategory::other ? m.peak : m.category[size_t(c)]) <= b;
  };
  if (r.devices.empty()) return under(device, r.memory);  // one device, or the fullest rank
  return std::all_of(r.devices.begin(), r.devices.end(), [&](const auto& d) { return under(d.device, d.memory); });
}

std::string Plan::nothing_fits() const {
  const PlanRow& s = least(rows, MemoryCategory::other);
  // Its live bytes may be under the budget while the segments that hold them are not: the step
  // then ran out on meta under the budget itself (fits_budget), from fragmentation.
  const std::string why = row_under_budget(s, MemoryCategory::other)
                              ? " allocated, but its blocks need " + format_bytes(s.memory.reserved) +
                                    " of segments and run out of memory under this budget"
                              : "";
  return "nothing fits " + budget_str() + ": the least a candidate needs is " + format_bytes(s.memory.peak) +
         why + " (" + s.combination.name + ")\n  hint: bf16pure halves parameters and activations, --optimizer adamw8bit "
         "shrinks the optimizer state, ckpt-sqrt or more accumulation shrink activations";
}

nlohmann::json Plan::to_json() const {
  nlohmann::json rows_j = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const PlanRow& r = rows[i];
    nlohmann::json j{{"combination", r.combination.name},
                     {"peak_bytes", r.memory.peak},
                     {"reserved_bytes", r.memory.reserved},
                     {"fits", r.fits},
                     {"ms_per_step", r.estimated_ms},
                     {"ms_per_step_from", r.from_steps ? "steps" : "flops"},
                     {"recommended", int(i) == recommended},
                     {"allocated_bytes", r.allocated_bytes}};
    for (MemoryCategory c : kAllMemoryCategories)
      j["peak_" + std::string(category_name(c)) + "_bytes"] = r.memory.category[size_t(c)];
    for (size_t k = 0; k < kNumFlopKinds; ++k) j["flops_" + std::string(flop_kind_name(FlopKind(k)))] = r.flops.flops[k];
    if (!r.devices.empty()) {  // a split row: each device's peaks
      nlohmann::json devices = nlohmann::json::array();
      for (size_t k = 0; k < r.devices.size(); ++k) {
        const StepMeasurement::DeviceMemory& d = r.devices[k];
        nlohmann::json dj{{"device", d.device.str()}, {"modules", d.modules}, {"peak_bytes", d.memory.peak},
                          {"reserved_bytes", d.memory.reserved}};
        for (MemoryCategory c : kAllMemoryCategories)
          dj["peak_" + std::string(category_name(c)) + "_bytes"] = d.memory.category[size_t(c)];
        if (budget_of(d.device) > 0) dj["budget_bytes"] = budget_of(d.device);
        if (k < r.measured_devices.size()) dj["measured_peak_bytes"] = r.measured_devices[k].memory.peak;
        devices.push_back(dj);
      }
      j["devices"] = devices;
    }
    if (!r.ranks.empty()) {  // a data-parallel row: each rank's peaks, rank 0's collectives
      nlohmann::json ranks = nlohmann::json::array();
      for (const PlanRow::RankMemory& k : r.ranks) {
        nlohmann::json kj{{"rank", k.rank}, {"peak_bytes", k.memory.peak}, {"reserved_bytes", k.memory.reserved}};
        for (MemoryCategory c : kAllMemoryCategories)
          kj["peak_" + std::string(category_name(c)) + "_bytes"] = k.memory.category[size_t(c)];
        ranks.push_back(kj);
      }
      j["ranks"] = ranks;
      j["collective_bytes"] = {{"all_reduce", r.traffic.all_reduce}, {"reduce_scatter", r.traffic.reduce_scatter},
                               {"all_gather", r.traffic.all_gather}, {"broadcast", r.traffic.broadcast}};
      j["collective_ms"] = r.comm_ms;
      j["collective_rates_measured"] = !r.comm_rates.empty();
    }
    if (r.measured) {
      j["measured_peak_bytes"] = r.measured->peak;
      j["measured_ms_per_step"] = r.measured_ms;
    } else if (!r.measured_fits) {
      j["measured_out_of_memory"] = true;
    }
    rows_j.push_back(j);
  }
  return rows_j;
}

}  // namespace mg
