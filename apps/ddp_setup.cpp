// Data-parallel setup of the training commands (see ddp_setup.h).
#include "apps/ddp_setup.h"

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include "core/device.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/safetensors.h"

namespace mg {

namespace fs = std::filesystem;

nlohmann::json DataParallelOptions::to_json() const {
  if (!enabled) return nullptr;
  return {{"world_size", world_size()}, {"zero", zero}, {"bucket_mb", bucket_mb}};
}

void add_data_parallel_flags(CLI::App* cmd, DataParallelOptions& d) {
  cmd->add_flag("--ddp", d.enabled,
                "data-parallel training over the ranks of mpirun (mpirun -np N memgrad ... --ddp): each rank "
                "computes the gradient of its shard of every batch, the ranks sum them");
  cmd->add_option("--zero", d.zero, "with --ddp: ZeRO stage, 1 shards the optimizer state over the ranks, 2 also the gradients")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  cmd->add_option("--bucket-mb", d.bucket_mb, "with --ddp: gradient bucket size in MiB (all-reduced as each fills)")
      ->capture_default_str();
  cmd->add_option("--ddp-timeout", d.timeout_s,
                  "with --ddp: seconds a collective waits for the other ranks before failing (default: "
                  "MEMGRAD_DDP_TIMEOUT_S or 300)");
}

namespace {

// The scratch run directory of a rank other than 0, removed when the process exits.
struct ScratchDir {
  std::string path;
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};
ScratchDir g_scratch;

}  // namespace

void prepare_data_parallel(TrainOptions& o, const std::string& cmd) {
  DataParallelOptions& d = o.data_parallel;
  if (!d.enabled) {
    MG_CHECK(d.zero == 0, cmd, ": --zero needs --ddp");
    return;
  }
  MG_CHECK(d.bucket_mb > 0, cmd, ": --bucket-mb must be positive, got ", d.bucket_mb);
  MG_CHECK(!o.parallel.active(), cmd, ": --ddp does not combine with a model split over devices (--split, "
           "--placement): each rank trains a whole replica");
  MG_CHECK(d.timeout_s >= 0, cmd, ": --ddp-timeout must be >= 0, got ", d.timeout_s);
  d.group = ProcessGroup::world(d.timeout_s > 0 ? std::chrono::milliseconds(int64_t(d.timeout_s * 1000))
                                                : ProcessGroup::default_timeout());
  const int N = d.world_size(), r = d.rank();
  // A resumed run's batch comes from its config.json (the loader shards it, evenly or not).
  MG_CHECK(!o.resume.empty() || o.batch % N == 0, cmd, ": --batch ", o.batch, " does not split evenly over ", N, " ranks",
           "\n  hint: --batch is the global batch; use a multiple of the number of ranks");
  MG_CHECK(!o.resume.empty() || o.techniques.micro_batch <= o.batch / N, cmd, ": --micro-batch ", o.techniques.micro_batch,
           " is larger than each rank's ", o.batch / N, " rows of the batch");
  MG_CHECK(!(d.zero > 0 && o.optimizer == OptimizerKind::adamw8bit), cmd,
           ": --zero cannot shard adamw8bit (its blocks span parameter boundaries); use adamw or sgd");
  // Each rank its share of this machine's cores, unless the user chose.
  if (!std::getenv("OMP_NUM_THREADS")) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int on_machine = local ? std::max(1, std::atoi(local)) : N;
    set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / on_machine));
  }
  const Device dev(o.device);
  if (dev.is_cuda()) {
    o.device = "cuda:" + std::to_string(d.group->local_rank());
    d.group->init_nccl();
  }
  if (r != 0) {
    o.progress = ProgressStyle::none;  // checkpoints: save_run_checkpoint writes on rank 0 only
    o.techniques.profile = false;
    std::error_code ec;
    if (!g_scratch.path.empty()) fs::remove_all(g_scratch.path, ec);  // an earlier run of this process
    g_scratch.path = (fs::temp_directory_path() / ("memgrad-rank" + std::to_string(r) + "-" + std::to_string(getpid()))).string();
    if (o.resume.empty()) o.out = g_scratch.path;  // a resumed run reads rank 0's directory
  }
}

std::pair<std::string, int64_t> metrics_file(const TrainOptions& o, const RunDir& run, int64_t resume_step) {
  if (o.data_parallel.is_root()) return {run.metrics_path(), resume_step};
  fs::create_directories(g_scratch.path);
  return {g_scratch.path + "/metrics.csv", -1};
}

DataLoaderOptions sharded(const TrainOptions& o, DataLoaderOptions l) {
  l.shard_rank = o.data_parallel.rank();
  l.shard_count = o.data_parallel.world_size();
  return l;
}

std::unique_ptr<DistributedDataParallel> make_data_parallel(const TrainOptions& o, Module& model) {
  const DataParallelOptions& d = o.data_parallel;
  if (!d.enabled) return nullptr;
  MG_CHECK(d.group, "make_data_parallel: prepare_data_parallel was not called");
  return std::make_unique<DistributedDataParallel>(
      model, d.group, DdpOptions{.bucket_bytes = int64_t(d.bucket_mb * double(1 << 20)), .zero = d.zero});
}

}  // namespace mg

namespace mg {

void save_run_checkpoint(const RunDir& run, const Module& model, const Optimizer& opt,
                         const DistributedDataParallel* ddp, const TrainingState& state) {
  if (ddp && ddp->sharded()) {
    const DistributedDataParallel::OptimizerState full = ddp->gather_optimizer_state(opt);  // every rank
    if (ddp->group().rank() == 0)
      run.save_checkpoint(model, [&](const std::string& path) { save_safetensors(path, full.tensors, full.metadata); }, state);
    return;
  }
  if (!ddp || ddp->group().rank() == 0) run.save_checkpoint(model, opt, state);
}

TrainingState load_run_checkpoint(const RunDir& run, Module& model, Optimizer& opt, const DistributedDataParallel* ddp) {
  if (!ddp || !ddp->sharded()) return run.load_checkpoint(model, &opt);
  return run.load_checkpoint(model, [&](const std::string& path) {
    const DistributedDataParallel::OptimizerState shard =
        ddp->shard_optimizer_state({load_safetensors(path), load_safetensors_metadata(path)});
    opt.load_state_dict(shard.tensors, shard.metadata);
  });
}

}  // namespace mg
