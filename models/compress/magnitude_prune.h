// Unstructured magnitude pruning (Han et al. 2015): the weights of smallest |w| in every Linear and
// Conv2d (embeddings, norms and biases are left alone) are set to zero, either the same fraction of
// each layer or one threshold over all of them (global), in one shot. A bitmask per weight (1 bit
// per element, allocated through the allocator, category other) keeps them at zero: call apply()
// after every optimizer step (Optimizer::add_post_step_hook). Zeros alone free nothing in a dense
// tensor; the bytes are saved when the weights are stored sparse (sparse_format.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/compress/importance.h"
#include "models/nn/module.h"

namespace mg {

class MagnitudeMask {
 public:
  // Computes the masks of `model`'s Linear and Conv2d weights (cpu) and zeroes the pruned weights.
  // amount in [0, 1): the fraction of those weights removed.
  MagnitudeMask(Module& model, double amount, PruneScope scope);
  // Masks read back (masks_state() of a previous mask) for the same model; applied at once. They
  // may cover a subset of the prunable weights (2:4 masks cover prunable_24_weights only).
  MagnitudeMask(Module& model, const NamedTensors& masks);
  // 2:4 semi-structured (sparse_24.h): the 2 smallest |w| of every group of 4 along each row of
  // every weight in prunable_24_weights(model) are zeroed and masked (50% of those weights).
  static MagnitudeMask two_four(Module& model);

  void apply();  // zeroes every masked weight again (after an optimizer step)
  // Raises the sparsity to `amount` (gradual pruning, gradual_schedule.h): the smallest |w| among
  // the weights still kept go too, and the masks are rewritten in place (no new mask bytes).
  // Weights already pruned stay pruned; an amount below the current sparsity changes nothing.
  void prune_to(double amount, PruneScope scope);
  // "<weight name>" -> its bitmask (u8), e.g. to save beside a checkpoint.
  const NamedTensors& masks_state() const { return masks_; }
  int64_t mask_bytes() const;
  int64_t masked_elements() const;  // elements of the weights under a mask
  int64_t pruned_elements() const;  // of those, the ones held at zero
  double sparsity() const { return masked_elements() ? double(pruned_elements()) / double(masked_elements()) : 0.0; }

 private:
  MagnitudeMask() = default;
  void make_masks();      // masks_ from the zeros of weights_
  NamedTensors weights_;  // the masked parameters, in model order
  NamedTensors masks_;    // their bitmasks, same order
};

// The parameters unstructured pruning masks: the weights of every Linear and Conv2d, by name.
NamedTensors prunable_weights(Module& model);

}  // namespace mg
