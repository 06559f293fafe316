// Activation offload: while an ActivationOffload guard is alive, every activation saved for
// backward is copied to another device's pool (host memory for a GPU; `cpu:1` when training on
// `cpu:0`) and brought back when its node's backward unpacks it, so the training device holds a
// saved activation only while forward still uses it and while its backward runs. Parameters and
// anything not tagged `activation` stay where they are; a tensor saved by several nodes (a view
// of the same storage region) is offloaded once. Built on the saved-tensor hooks. A meta step
// offloads to another meta device (meta:1), which is how the planner measures offload.
#pragma once
#include <memory>

#include "autograd/saved_tensor.h"
#include "core/device.h"

namespace mg {

struct OffloadStats {
  int64_t tensors = 0;  // saved tensors moved out
  int64_t bytes = 0;    // their bytes (once per distinct region)
};

class ActivationOffload {
 public:
  explicit ActivationOffload(Device target);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;
  const OffloadStats& stats() const;
  Device target() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<SavedTensorHooksGuard> hooks_;
};

}  // namespace mg
