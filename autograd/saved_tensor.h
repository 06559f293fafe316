// SavedTensor: a tensor a Node keeps for its backward. It is stored detached (no grad_fn, so a
// node saving its own output makes no reference cycle), remembers the storage version at save
// time (an in-place write after that is an error at backward, naming the node), passes through
// the thread's saved-tensor hooks (pack at save, unpack at backward: activation offload), and
// is released by the engine right after its node ran.
#pragma once
#include <any>
#include <functional>
#include <memory>

#include "core/tensor.h"

namespace mg {

class Node;

class SavedTensor {
 public:
  explicit SavedTensor(Node* owner);  // registers itself with its node (see Node::release_saved)
  SavedTensor(const SavedTensor&) = delete;
  SavedTensor& operator=(const SavedTensor&) = delete;

  void save(const Tensor& t);
  // The tensor for backward; throws if it was modified in place or already released.
  Tensor unpack() const;
  void reset();
  bool defined() const { return state_ != State::empty; }

 private:
  enum class State { empty, saved, released };
  Node* owner_;
  State state_ = State::empty;
  Tensor tensor_;                  // when no hooks were active
  std::any packed_;                // what the pack hook returned
  std::function<Tensor(const std::any&)> unpack_;
  std::weak_ptr<Storage> storage_; // for the version check
  uint64_t version_ = 0;
};

// Pack/unpack hooks for every tensor saved while the guard is alive (innermost wins).
struct SavedTensorHooks {
  std::function<std::any(const Tensor&)> pack;
  std::function<Tensor(const std::any&)> unpack;
};

class SavedTensorHooksGuard {
 public:
  explicit SavedTensorHooksGuard(SavedTensorHooks hooks);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;
};

const SavedTensorHooks* current_saved_tensor_hooks();

}  // namespace mg
