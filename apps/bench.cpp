// memgrad bench (see bench.h): parsing the combinations, running each as a short training run in
// its own run directory (fresh allocator state, same seed and data), the table and bench.csv.
#include "apps/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "apps/ddp_setup.h"
#include "core/allocator.h"
#include "core/error.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

bool is_gpt(const BenchOptions& o) {
  if (o.gpt) return true;
  if (o.mobilenet) return false;
  for (const auto& n : GPTConfig::names())
    if (n == o.model) return true;
  for (const auto& n : MobileNetV2Config::names())
    if (n == o.model) return false;
  std::string known;
  for (const auto& n : GPTConfig::names()) known += n + ", ";
  for (const auto& n : MobileNetV2Config::names()) known += n + ", ";
  MG_THROW("bench: unknown --model '", o.model, "' (known: ", known.substr(0, known.size() - 2), ")");
}

// The device saved activations go to: the next CPU pool, or host memory from a GPU.
Device offload_target(const Device& d) { return d.is_cpu() ? Device(DeviceType::cpu, d.index + 1) : kCPU; }

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// Every rank's step memory (peak, reserved, each category), gathered on every rank (--ddp).
std::vector<StepMemory> gather_rank_memory(const StepMemory& mine) {
  auto g = ProcessGroup::world();
  constexpr int64_t k = 2 + kNumMemoryCategories;
  Tensor in = empty({k}, {.dtype = DType::i64}), all = empty({k * g->world_size()}, {.dtype = DType::i64});
  int64_t* p = in.data<int64_t>();
  p[0] = mine.peak, p[1] = mine.reserved;
  for (size_t c = 0; c < kNumMemoryCategories; ++c) p[2 + c] = mine.category[c];
  g->all_gather(in, all);
  std::vector<StepMemory> out(size_t(g->world_size()));
  for (size_t r = 0; r < out.size(); ++r) {
    const int64_t* q = all.data<int64_t>() + r * k;
    out[r].peak = q[0], out[r].reserved = q[1];
    for (size_t c = 0; c < kNumMemoryCategories; ++c) out[r].category[c] = q[2 + c];
  }
  return out;
}

void fresh_state(const Device& d, const std::vector<Device>& split_devices, const std::vector<Combination>& combos) {
  empty_cache(d);
  reset_peak_stats(d);
  for (const Device& s : split_devices) empty_cache(s), reset_peak_stats(s);
  for (const auto& c : combos)
    if (c.techniques.offload_activations) {
      empty_cache(*c.techniques.offload_activations);
      reset_peak_stats(*c.techniques.offload_activations);
    }
}

// A row's data parallelism: the run's --ddp, with the row's ZeRO stage when it names one (ddp=N,
// zeroS=N), which needs a launch of exactly N ranks.
DataParallelOptions row_data_parallel(const BenchOptions& o, const Combination& c, const LaunchInfo& launch) {
  DataParallelOptions d = o.data_parallel;
  if (c.ranks == 0) return d;
  MG_CHECK(d.enabled && launch.world_size == c.ranks, "bench: '", c.name, "' trains over ", c.ranks, " ranks; run it "
           "under mpirun -np ", c.ranks, " with --ddp (this is ", d.enabled ? std::to_string(launch.world_size) + " ranks" :
           std::string("one process without --ddp"), ")");
  d.zero = c.zero;
  return d;
}

}  // namespace

Combination parse_combination(const std::string& text, int64_t batch, const Device& device,
                              const std::vector<Device>& split_devices) {
  Combination c{text, {}};
  MG_CHECK(!text.empty(), "bench: an empty combination in --techniques");
  if (text == "none") return c;
  bool precision_set = false, checkpoint_set = false;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, '+')) {
    auto set_checkpoint = [&](const std::string& policy) {
      MG_CHECK(!checkpoint_set, "bench: '", text, "' names two checkpoint policies");
      checkpoint_set = true;
      c.techniques.checkpoint = CheckpointPolicy::parse(policy);  // ckpt-everyK: K checked here
    };
    auto set_precision = [&](const std::string& p) {
      MG_CHECK(!precision_set, "bench: '", text, "' names two precisions");
      precision_set = true;
      c.techniques.precision = parse_precision(p);
    };
    if (part == "ckpt") set_checkpoint("blocks");
    else if (part == "ckpt-sqrt") set_checkpoint("sqrt");
    else if (part == "selective") set_checkpoint("selective");
    else if (part.rfind("ckpt-every", 0) == 0) set_checkpoint("every:" + part.substr(10));
    else if (part == "bf16") set_precision("bf16");
    else if (part == "fp16") set_precision("fp16");
    else if (part == "bf16pure" || part == "bf16-pure") set_precision("bf16-pure");
    else if (part.rfind("accum", 0) == 0) {
      const std::string k = part.substr(5);
      MG_CHECK(!k.empty() && k.find_first_not_of("0123456789") == std::string::npos && std::stoll(k) >= 1, "bench: '",
               part, "' needs a whole number of micro-batches, e.g. accum4");
      const int64_t n = std::stoll(k);
      MG_CHECK(batch % n == 0, "bench: '", part, "' splits the batch of ", batch, " into ", n,
               " micro-batches, which does not divide it");
      c.techniques.micro_batch = batch / n;
    } else if (part == "offload") {
      c.techniques.offload_activations = offload_target(device);
    } else if (part == "adam8bit" || part == "adamw8bit") {
      MG_CHECK(!c.optimizer, "bench: '", text, "' names adam8bit twice");
      c.optimizer = OptimizerKind::adamw8bit;
    } else if (part.rfind("ddp=", 0) == 0 || part.rfind("zero1=", 0) == 0 || part.rfind("zero2=", 0) == 0) {
      MG_CHECK(c.ranks == 0, "bench: '", text, "' names data parallelism twice");
      const std::string n = part.substr(part.find('=') + 1);
      MG_CHECK(!n.empty() && n.size() < 6 && n.find_first_not_of("0123456789") == std::string::npos && std::stoi(n) >= 1,
               "bench: '", part, "' needs a whole number of ranks, e.g. ", part.substr(0, part.find('=') + 1), "2");
      c.ranks = std::stoi(n);
      c.zero = part[0] == 'd' ? 0 : part[4] - '0';
      MG_CHECK(batch % c.ranks == 0, "bench: '", part, "' splits the batch of ", batch, " over ", c.ranks,
               " ranks, which does not divide it\n  hint: --batch is the global batch; use a multiple of the ranks");
    } else if (part.rfind("split=", 0) == 0 || part.rfind("pipeline=", 0) == 0) {
      // Model parallelism: the library's own parsers, their errors prefixed with the combination.
      const bool split = part[0] == 's';
      MG_CHECK(!(split ? c.parallel.split.has_value() : c.parallel.pipeline.has_value()), "bench: '", text,
               "' names two ", split ? "splits" : "pipelines");
      try {
        if (split) c.parallel.split = SplitSpec::parse(part.substr(6));
        else c.parallel.pipeline = parse_pipeline(part.substr(9));
      } catch (const Error& e) {
        MG_THROW("bench: '", part, "' in '", text, "': ", e.what());
      }
    } else {
      MG_THROW("bench: unknown technique '", part, "' in '", text,
               "' (known: none, ckpt, ckpt-sqrt, ckpt-everyK, selective, bf16, fp16, bf16pure, accumN, offload, "
               "adam8bit, split=S, pipeline=P, ddp=N, zero1=N, zero2=N)");
    }
  }
  MG_CHECK(!(c.optimizer && c.techniques.precision == Precision::bf16_pure), "bench: '", text,
           "': adam8bit updates f32 parameters and bf16pure stores them in bf16; use adam8bit with fp32, bf16 or fp16");
  if (c.ranks > 0) {  // what prepare_data_parallel refuses, refused before anything runs
    MG_CHECK(!c.parallel.active(), "bench: '", text, "': each data-parallel rank trains a whole replica; a split model "
             "does not combine with ", c.zero ? "zero" + std::to_string(c.zero) : std::string("ddp"), "=");
    MG_CHECK(c.techniques.precision != Precision::bf16_pure, "bench: '", text, "': data-parallel gradients are summed "
             "in f32 and bf16pure stores them in bf16; use bf16 (autocast) with ddp= or zero=");
    MG_CHECK(!(c.zero > 0 && c.optimizer), "bench: '", text, "': ZeRO cannot shard adam8bit (its blocks span parameter "
             "boundaries); use ddp= with adam8bit, or zero= with AdamW");
    MG_CHECK(c.techniques.micro_batch <= batch / c.ranks, "bench: '", text, "': the micro-batch of ",
             c.techniques.micro_batch, " is larger than each rank's ", batch / c.ranks, " rows of the batch");
  }
  if (c.parallel.split) {
    MG_CHECK(!split_devices.empty(), "bench: '", text, "' splits the model over --devices; give them, e.g. "
             "--devices cpu:0,cpu:1");
    c.parallel.devices = split_devices;
  }
  if (c.parallel.pipeline) {
    MG_CHECK(c.parallel.split, "bench: '", text, "' pipelines stages of a split model; add split=stages:K or "
             "split=balanced");
    MG_CHECK(c.techniques.micro_batch > 0, "bench: '", text, "' runs micro-batches through the stages; add accumN "
             "(e.g. ", text, "+accum4)");
  }
  // What the training commands would refuse (a pipeline over tensor or attention-mlp, with offload,
  // one device in --devices), refused here before anything runs.
  c.parallel.validate("bench: '" + text + "'", c.techniques.micro_batch, false,
                      c.techniques.offload_activations.has_value());
  return c;
}

OptimizerKind Combination::optimizer_for(OptimizerKind run) const {
  if (!optimizer) return run;
  MG_CHECK(run != OptimizerKind::sgd, "'", name, "' stores AdamW's moments in 8 bits, but the run's optimizer is sgd",
           "\n  hint: drop adam8bit, or train with --optimizer adamw");
  return *optimizer;
}

std::vector<Combination> parse_combinations(const std::string& list, int64_t batch, const Device& device,
                                            const std::vector<Device>& split_devices) {
  std::vector<Combination> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    for (const auto& c : out) MG_CHECK(c.name != item, "bench: '", item, "' appears twice in --techniques");
    out.push_back(parse_combination(item, batch, device, split_devices));
  }
  MG_CHECK(!out.empty(), "bench: --techniques is empty");
  if (!split_devices.empty()) {
    bool any = false;
    for (const auto& c : out) any = any || c.parallel.active();
    MG_CHECK(any, "bench: --devices is for combinations that split the model, and none of --techniques does (add "
             "e.g. split=balanced)");
  }
  return out;
}

const DevicePeak* BenchRow::on(const Device& d) const {
  for (const DevicePeak& p : device_peaks)
    if (p.device == d) return &p;
  return nullptr;
}

const BenchRow& BenchResult::baseline() const {
  MG_INTERNAL_ASSERT(!rows.empty(), "bench result without rows");
  for (const auto& r : rows)
    if (r.name == "none") return r;
  return rows.front();
}

BenchResult run_bench(const BenchOptions& o) {
  MG_CHECK(o.steps >= 2, "bench: --steps must be at least 2 (the first step is warm-up), got ", o.steps);
  MG_CHECK(o.batch >= 0, "bench: --batch must be positive, got ", o.batch);
  const bool gpt = is_gpt(o);
  const Device device(o.device);
  BenchResult r;
  r.model = o.gpt || o.mobilenet ? std::string("custom") : o.model;
  r.unit = gpt ? "tok/s" : "img/s";
  r.steps = o.steps;
  r.batch = o.batch > 0 ? o.batch : gpt ? 8 : 64;
  const std::vector<Combination> combos = parse_combinations(o.techniques, r.batch, device, o.devices);
  if (!o.devices.empty()) {  // a peak column per device: --device first unless the split uses it
    if (std::find(o.devices.begin(), o.devices.end(), device) == o.devices.end()) r.device_columns.push_back(device);
    r.device_columns.insert(r.device_columns.end(), o.devices.begin(), o.devices.end());
  }
  // --ddp: rank 0 writes the folder; the other ranks work in a scratch one of their own.
  const LaunchInfo launch = launch_info_from_env();
  for (const Combination& c : combos) (void)row_data_parallel(o, c, launch);  // a wrong launch fails before any row runs
  r.world_size = o.data_parallel.enabled ? launch.world_size : 1;
  if (o.data_parallel.enabled && launch.rank != 0) {
    r.out_dir = (fs::temp_directory_path() / ("memgrad-bench-rank" + std::to_string(launch.rank) + "-" +
                                              std::to_string(::getpid()))).string();
    fs::remove_all(r.out_dir);
  } else if (o.out.empty()) {
    char stamp[32];
    std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
    r.out_dir = "runs/bench-" + r.model + "-" + stamp;
  } else {
    r.out_dir = o.out;
  }
  MG_CHECK(!fs::exists(r.out_dir + "/bench.csv"), "bench: '", r.out_dir, "' already holds a bench.csv; choose another --out");
  fs::create_directories(r.out_dir);
  // GPT: the corpus is tokenized once, into <out>/data.tokens, and every row reads that file.
  std::string gpt_data = o.data;
  if (gpt) {
    const std::string source = o.data.empty() ? kFortunesDir : o.data;
    if (!(fs::is_regular_file(source) && is_token_file(source))) {
      MG_CHECK(fs::exists(source), "bench: --data '", source, "' does not exist");
      gpt_data = r.out_dir + "/data.tokens";
      tokenize_files({source}, gpt_data);
    }
  }

  for (const Combination& c : combos) {
    fresh_state(device, o.devices, combos);
    const std::string run_dir = r.out_dir + "/runs/" + c.name;
    fs::remove_all(run_dir);
    BenchRow row{.name = c.name, .techniques = c.techniques, .parallel = c.parallel};
    if (gpt) {
      GptTrainOptions t;
      t.config = o.model;
      t.model = o.gpt;
      t.data = gpt_data;
      t.steps = o.steps;
      t.batch = r.batch;
      t.seed = o.seed;
      t.device = o.device;
      t.out = run_dir;
      t.eval_every = o.steps;
      t.eval_windows = 4;
      t.save_checkpoints = false;
      t.techniques = c.techniques;
      t.optimizer = c.optimizer_for(t.optimizer);
      t.parallel = c.parallel;
      t.progress = ProgressStyle::none;
      t.data_parallel = row_data_parallel(o, c, launch);
      GptTrainResult g = gpt_train(t);
      row.device_peaks = g.device_peaks;
      row.comm_ms = g.comm_ms, row.exposed_comm_ms = g.exposed_comm_ms;
      row.offloaded_bytes = g.offloaded_bytes;
      row.memory = g.memory;
      row.ms_per_step = g.ms_per_step;
      row.throughput = g.tokens_per_s;
      row.loss = g.last_loss;
      row.micro_batch = g.micro_batch;
    } else {
      VisionTrainOptions t;
      t.model = o.model;
      t.config = o.mobilenet;
      t.data = o.data.empty() ? "fashion-mnist" : o.data;
      t.epochs = 1;
      t.batch = r.batch;
      t.limit_train = r.batch * o.steps;  // one epoch of exactly `steps` steps
      t.limit_test = std::min<int64_t>(256, r.batch * 4);
      t.seed = o.seed;
      t.device = o.device;
      t.out = run_dir;
      t.save_checkpoints = false;
      t.techniques = c.techniques;
      t.optimizer = c.optimizer_for(t.optimizer);
      t.parallel = c.parallel;
      t.progress = ProgressStyle::none;
      t.data_parallel = row_data_parallel(o, c, launch);
      VisionTrainResult v = vision_train(t);
      row.device_peaks = v.device_peaks;
      row.comm_ms = v.comm_ms, row.exposed_comm_ms = v.exposed_comm_ms;
      row.offloaded_bytes = v.offloaded_bytes;
      MG_CHECK(v.steps_done == o.steps, "bench: the data gave ", v.steps_done, " steps instead of ", o.steps,
               " (fewer than ", r.batch * o.steps, " training images)");
      row.memory = v.memory;
      row.ms_per_step = v.ms_per_step;
      row.throughput = v.images_per_s;
      row.loss = v.last_loss;
      row.micro_batch = v.micro_batch;
    }
    if (row.device_peaks.empty()) {  // one device: its steady peaks are the row's
      DevicePeak p{.device = device, .peak = row.memory.peak, .category = row.memory.category, .modules = "all"};
      row.device_peaks.push_back(p);
    }
    if (o.data_parallel.enabled) row.rank_memory = gather_rank_memory(row.memory);
    if (o.progress != ProgressStyle::none && launch.rank == 0) {
      std::string devices;  // a split row: every device's peak
      if (c.parallel.active())
        for (const DevicePeak& p : row.device_peaks) devices += "  " + p.device.str() + " " + format_bytes(p.peak);
      std::printf("bench %-22s peak %8.2f MiB  activations %8.2f MiB  %8.1f ms/step  loss %.4f%s\n", c.name.c_str(),
                  mib(row.memory.peak), mib(row.memory.category[size_t(MemoryCategory::activation)]), row.ms_per_step,
                  row.loss, devices.c_str());
      std::fflush(stdout);
    }
    r.rows.push_back(row);
  }
  if (launch.rank != 0 && o.data_parallel.enabled) {
    fs::remove_all(r.out_dir);
    return r;
  }
  write_bench_csv(r, r.out_dir + "/bench.csv");
  write_bench_html(r, r.out_dir + "/bench.html");
  return r;
}

std::string BenchResult::table() const {
  const BenchRow& base = baseline();
  const auto act = [](const BenchRow& row) { return row.memory.category[size_t(MemoryCategory::activation)]; };
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof(line),
                "memgrad bench: %s, batch %lld, %lld steps (memory: peak allocated MiB per category over the steps "
                "after the first; ms/step: median of %lld steps after the first; ratios to '%s')\n",
                model.c_str(), (long long)batch, (long long)steps, (long long)(steps > 2 ? steps - 1 : steps),
                base.name.c_str());
  os << line;
  if (world_size > 1) {
    std::snprintf(line, sizeof(line), "data-parallel over %d ranks: batch %lld is the global batch; rows of memory per "
                  "rank follow each combination (the combination's own row is rank 0's)\n", world_size, (long long)batch);
    os << line;
  }
  if (steps - 1 < 5)
    os << "warning: the times are medians of fewer than 5 steps; give --steps 6 or more for figures to compare\n";
  if (!device_columns.empty())
    os << "split rows: 'total' is the largest device's peak, each device's own follows its row; a pipeline's stages "
          "each get 1/p of the threads, so every row uses the same threads in all\n";
  int name_w = 22;  // the combination column: as wide as the longest name
  for (const BenchRow& row : rows) name_w = std::max(name_w, int(row.name.size()));
  std::snprintf(line, sizeof(line), "%-*s %8s %8s %8s %8s %8s %8s %8s %9s %9s %9s %10s %8s %6s %6s %6s", name_w, "combination",
                "param", "grad", "optim", "activ", "work", "input", "total", "reserved", "offloaded", "ms/step",
                unit.c_str(), "loss", "mem", "act", "time");
  os << line;
  for (const Device& d : device_columns) {
    std::snprintf(line, sizeof(line), " %10s", ("@" + d.str()).c_str());
    os << line;
  }
  os << "\n";
  for (const BenchRow& row : rows) {
    const auto& c = row.memory.category;
    auto cat = [&](MemoryCategory k) { return mib(c[size_t(k)]); };
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::snprintf(line, sizeof(line),
                  "%-*s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %9.1f %10.0f %8.4f %5.2fx %5.2fx %5.2fx",
                  name_w, row.name.c_str(), cat(MemoryCategory::parameter), cat(MemoryCategory::gradient),
                  cat(MemoryCategory::optimizer_state), cat(MemoryCategory::activation), cat(MemoryCategory::workspace),
                  cat(MemoryCategory::input), mib(row.memory.peak), mib(row.memory.reserved), mib(row.offloaded_bytes),
                  row.ms_per_step,
                  row.throughput, row.loss, ratio(double(row.memory.peak), double(base.memory.peak)),
                  ratio(double(act(row)), double(act(base))), ratio(row.ms_per_step, base.ms_per_step));
    os << line;
    for (const Device& d : device_columns) {  // each device's peak (MiB), "-" where the row did not use it
      const DevicePeak* p = row.on(d);
      if (p) std::snprintf(line, sizeof(line), " %10.2f", mib(p->peak));
      else std::snprintf(line, sizeof(line), " %10s", "-");
      os << line;
    }
    os << "\n";
    if (row.parallel.active())  // a split row: each device's own peaks per category
      for (const DevicePeak& p : row.device_peaks) {
        std::snprintf(line, sizeof(line), "  %-*s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f  %s\n", name_w - 2,
                      p.device.str().c_str(),
                      mib(p.of(MemoryCategory::parameter)), mib(p.of(MemoryCategory::gradient)),
                      mib(p.of(MemoryCategory::optimizer_state)), mib(p.of(MemoryCategory::activation)),
                      mib(p.of(MemoryCategory::workspace)), mib(p.of(MemoryCategory::input)), mib(p.peak),
                      p.modules.c_str());
        os << line;
      }
    for (size_t k = 0; k < row.rank_memory.size(); ++k) {  // --ddp: each rank's own peaks
      const auto& m = row.rank_memory[k];
      auto rc = [&](MemoryCategory x) { return mib(m.category[size_t(x)]); };
      std::snprintf(line, sizeof(line), "  rank %-*zu %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f\n", name_w - 7, k,
                    rc(MemoryCategory::parameter), rc(MemoryCategory::gradient), rc(MemoryCategory::optimizer_state),
                    rc(MemoryCategory::activation), rc(MemoryCategory::workspace), rc(MemoryCategory::input), mib(m.peak),
                    mib(m.reserved));
      os << line;
    }
    if (!row.rank_memory.empty()) {
      std::snprintf(line, sizeof(line),
                    "  collectives %.1f ms/step, %.1f ms of it after backward: %.0f%% hidden behind backward\n",
                    row.comm_ms, row.exposed_comm_ms,
                    row.comm_ms > 0 ? 100.0 * std::max(0.0, 1.0 - row.exposed_comm_ms / row.comm_ms) : 0.0);
      os << line;
    }
  }
  return os.str();
}

void write_bench_csv(const BenchResult& r, const std::string& path) {
  std::ofstream f(path + ".tmp");
  MG_CHECK(f.good(), "bench: cannot write '", path, "'");
  const BenchRow& base = r.baseline();
  f << "combination,checkpoint,precision,micro_batch,offload";
  for (MemoryCategory c : kAllMemoryCategories) f << ",peak_" << category_name(c) << "_bytes";
  f << ",peak_bytes,reserved_bytes,offloaded_bytes,ms_per_step," << (r.unit == "tok/s" ? "tokens_per_s" : "images_per_s")
    << ",loss,memory_ratio,activation_ratio,time_ratio";
  if (!r.device_columns.empty()) {  // --devices: the split, and every device's peaks
    f << ",split,pipeline";
    for (const Device& d : r.device_columns) {
      f << ",peak_bytes@" << d.str();
      for (MemoryCategory c : kAllMemoryCategories) f << ",peak_" << category_name(c) << "_bytes@" << d.str();
    }
  }
  f << "\n";
  const size_t act = size_t(MemoryCategory::activation);
  for (const BenchRow& row : r.rows) {
    f << row.name << ',' << row.techniques.checkpoint.str() << ',' << precision_name(row.techniques.precision) << ','
      << row.micro_batch << ',' << (row.techniques.offload_activations ? row.techniques.offload_activations->str() : "");
    for (MemoryCategory c : kAllMemoryCategories) f << ',' << row.memory.category[size_t(c)];
    char tail[256];
    std::snprintf(tail, sizeof(tail), ",%lld,%lld,%lld,%.3f,%.1f,%.6f,%.4f,%.4f,%.4f\n", (long long)row.memory.peak,
                  (long long)row.memory.reserved, (long long)row.offloaded_bytes, row.ms_per_step, row.throughput, row.loss,
                  base.memory.peak ? double(row.memory.peak) / double(base.memory.peak) : 0.0,
                  base.memory.category[act] ? double(row.memory.category[act]) / double(base.memory.category[act]) : 0.0,
                  base.ms_per_step > 0 ? row.ms_per_step / base.ms_per_step : 0.0);
    std::string line(tail);
    line.pop_back();  // the newline: device columns follow
    f << line;
    if (!r.device_columns.empty()) {
      f << ',' << (row.parallel.split ? row.parallel.split->str() : "") << ','
        << (row.parallel.pipeline ? pipeline_name(*row.parallel.pipeline) : "");
      for (const Device& d : r.device_columns) {
        const DevicePeak* p = row.on(d);
        f << ',' << (p ? std::to_string(p->peak) : "");
        for (MemoryCategory c : kAllMemoryCategories) f << ',' << (p ? std::to_string(p->of(c)) : "");
      }
    }
    f << '\n';
  }
  f.close();
  MG_CHECK(f.good(), "bench: writing '", path, "' failed");
  fs::rename(path + ".tmp", path);
}

}  // namespace mg
