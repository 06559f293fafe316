// Data-parallel training in the apps: the flags, what a training command changes on each rank,
// and the DDP wrapper the training loop steps through. Rank 0 is the run: it prints, writes
// metrics.csv and checkpoints into the run directory. The other ranks train in step with it, print
// nothing, write their config and metrics into a scratch directory that is removed at exit, and
// read every global batch's rows [B r / N, B (r+1) / N) (the loader shards; same order everywhere).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "apps/data_parallel_options.h"
#include "apps/run_dir.h"
#include "apps/training_loop.h"
#include "data/data_loader.h"
#include "parallel/ddp.h"

namespace mg {

void add_data_parallel_flags(CLI::App* cmd, DataParallelOptions& d);

// With --ddp: joins the process group (mpirun's ranks), checks the flags (the batch divides into
// the ranks; no adamw8bit under --zero), gives each rank its share of the cores
// unless OMP_NUM_THREADS is set, moves cuda:N to cuda:LOCAL_RANK (NCCL), and makes the ranks
// other than 0 quiet with a scratch run directory. Without --ddp: nothing.
void prepare_data_parallel(TrainOptions& o, const std::string& cmd);

// Where the loop logs metrics.csv and the step it resumes from: the run's file on rank 0; a
// scratch file on the other ranks (never rank 0's, even when resuming from its directory).
std::pair<std::string, int64_t> metrics_file(const TrainOptions& o, const RunDir& run, int64_t resume_step);

// This rank's rows of every batch.
DataLoaderOptions sharded(const TrainOptions& o, DataLoaderOptions l);

// The DDP wrapper over the loop's model (null without --ddp). Collective.
std::unique_ptr<DistributedDataParallel> make_data_parallel(const TrainOptions& o, Module& model);

// The loop's checkpoint and resume. Rank 0 writes the checkpoint; under ZeRO every rank first
// helps gather the whole optimizer state (collective: every rank calls it), and on resume each
// rank loads its shard of it (Note [ZeRO checkpoints] in parallel/ddp.h).
void save_run_checkpoint(const RunDir& run, const Module& model, const Optimizer& opt,
                         const DistributedDataParallel* ddp, const TrainingState& state);
TrainingState load_run_checkpoint(const RunDir& run, Module& model, Optimizer& opt, const DistributedDataParallel* ddp);

// Whether this process prints the command's result (rank 0, or no --ddp).
inline bool prints_results(const TrainOptions& o) { return !o.data_parallel.enabled || launch_info_from_env().rank == 0; }

}  // namespace mg
