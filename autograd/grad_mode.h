// Grad mode: whether ops record a graph. NoGradGuard turns recording off in a scope (optimizer
// steps, evaluation); InferenceGuard is the same switch under the name users expect for
// inference-only code. Both are thread-local, like PyTorch's.
#pragma once

namespace mg {

bool grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Re-enables recording inside a NoGradGuard (checkpoint recomputation uses it).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

using InferenceGuard = NoGradGuard;

}  // namespace mg
