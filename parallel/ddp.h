// DistributedDataParallel: every rank holds the whole model, computes the gradient of its shard
// of the global batch, and the ranks sum their gradients so each applies the global batch's
// update. Parameters are grouped into buckets (~25 MiB) in the order backward finishes them;
// a bucket is all-reduced on a communication thread as soon as its last gradient is ready (the
// engine's grad-ready hooks), overlapping the rest of backward. The parameters' gradients are
// views into the buckets (moved there as each becomes ready), so no second copy exists. ZeRO (Note [ZeRO shards]): stage 1 shards
// the optimizer state, stage 2 also the gradients (reduce-scattered bucket by bucket).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/named_tensors.h"
#include "models/nn/module.h"
#include "optim/gradient_sync.h"
#include "optim/optimizer.h"
#include "parallel/process_group.h"

namespace mg {

struct DdpOptions {
  int64_t bucket_bytes = int64_t(25) << 20;  // --bucket-mb
  int zero = 0;                               // 0: plain DDP; 1: optimizer state sharded; 2: + gradients
};

// Note [ZeRO shards]: each bucket's flat length is padded to a multiple of the world size N and
// rank r owns the r-th of its N equal slices. The optimizer runs over views of the parameters'
// owned pieces ("h.0.mlp.fc.weight[1024:2048]"), so its state is 1/N of the total; after the
// update every bucket's slices are all-gathered back into the parameters.
class DistributedDataParallel final : public GradientSync {
 public:
  // Collective: checks that every rank holds the same parameters (names, shapes, dtypes; an
  // error naming the first difference otherwise), then copies rank 0's parameters and buffers to
  // every rank. Parameters must be f32 or f64, on the host (MPI) or on cuda:local_rank (NCCL).
  DistributedDataParallel(Module& model, std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The groups the optimizer must take: `groups` unchanged (stage 0), or this rank's shard views
  // of their parameters with each group's settings (stages 1 and 2).
  std::vector<ParamGroup> optimizer_groups(const std::vector<ParamGroup>& groups) const;

  // GradientSync.
  double sum_across(double local) override;
  void before_micro_batch(int64_t index, int64_t count) override;
  void finish_gradients() override;
  bool sharded() const override { return opt_.zero > 0; }
  void after_step() override;

  ProcessGroup& group() const { return *group_; }
  const DdpOptions& options() const { return opt_; }
  int64_t num_buckets() const;
  // Elements of every bucket, padded (what the gradient buffers hold in total).
  int64_t padded_elements() const;
  // Seconds the communication thread spent in collectives during the last step, and how much of
  // it ran after backward had finished (the exposed, not hidden, part).
  double comm_seconds() const { return comm_s_; }
  double exposed_comm_seconds() const { return exposed_s_; }
  std::string str() const;  // "DDP over 2 ranks, 1 bucket (3.3 MB), ZeRO-1"

  // Note [ZeRO checkpoints]: a checkpoint holds the optimizer state of the whole model, as one
  // process would save it, so a ZeRO run resumes with any --zero (and a plain run with ZeRO).
  // gather_optimizer_state (collective) assembles it from every rank's shard of `opt` (an
  // optimizer over optimizer_groups()); shard_optimizer_state cuts this rank's shard out of it,
  // ready for opt.load_state_dict. Stage 0 passes both through.
  struct OptimizerState {
    NamedTensors tensors;
    std::map<std::string, std::string> metadata;
  };
  OptimizerState gather_optimizer_state(const Optimizer& opt) const;
  OptimizerState shard_optimizer_state(const OptimizerState& full) const;

 private:
  struct Bucket;
  class CommThread;
  void on_grad_ready(size_t param);
  void launch_ready();
  void communicate(std::function<void()> task);  // on the communication thread (a simulated group: here)
  void retire_in_flight();                       // Note [One bucket in flight] (ddp.cpp)
  void launch(Bucket& b);
  void adopt_gradient(size_t param);  // into its bucket's view (stages 0, 1)
  void gather_parameters();
  void broadcast_buffers();  // rank 0's model buffers to every rank

  Module& model_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions opt_;
  NamedTensors params_;
  std::vector<size_t> bucket_of_;  // param -> bucket
  std::vector<int64_t> offset_of_;  // param -> its first element in the bucket
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unique_ptr<CommThread> comm_;
  bool syncing_ = false;      // this backward's hooks launch buckets
  size_t next_launch_ = 0;    // buckets launch in index order on every rank
  double comm_s_ = 0, exposed_s_ = 0;
  double busy_s_ = 0, waited_s_ = 0;  // this step's so far, before finish_gradients adds its wait
  std::vector<Tensor> in_flight_;     // ZeRO-2: the last launched bucket's buffers
  std::shared_ptr<DistributedDataParallel*> alive_;  // what the grad-ready hooks call through
  // Per optimizer group: its parameters, and this rank's pieces of them (optimizer_groups).
  mutable std::vector<int64_t> group_sizes_, group_pieces_;
};

}  // namespace mg
