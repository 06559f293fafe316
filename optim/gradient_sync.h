// GradientSync: how a data-parallel wrapper (parallel/ddp.h) joins the Trainer's step without
// the Trainer knowing about ranks. The Trainer asks it for sums over ranks (the batch's counted
// terms, so every rank weights its micro losses by the global count; the reported loss; the
// squared gradient norm when the optimizer holds shards), tells it when each micro-batch starts
// and when backward is over, and lets it gather parameters after the update.
#pragma once
#include <cstdint>

namespace mg {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // A host number summed over the ranks. Called with no communication in flight.
  virtual double sum_across(double local) = 0;
  // Before micro-batch `index` of `count` runs forward and backward (no_sync for all but the last).
  virtual void before_micro_batch(int64_t index, int64_t count) = 0;
  // After the step's last backward: returns once every gradient the optimizer reads is the sum
  // over ranks (of the weighted micro losses, so the global batch's gradient).
  virtual void finish_gradients() = 0;
  // True when each rank's optimizer holds a disjoint shard of the parameters (ZeRO): a global
  // gradient norm is then the sum over ranks of the local squared norms.
  virtual bool sharded() const = 0;
  // After the optimizer step and its zero_grad: drops the step's buffers, gathers updated
  // parameters (ZeRO), makes the ranks' model buffers equal.
  virtual void after_step() = 0;
};

}  // namespace mg
