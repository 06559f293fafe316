// Ctrl-C while training: the first SIGINT only raises a flag, so the training loop can finish its
// step, write a checkpoint and return (a second one ends the process as usual). The previous
// handler comes back when the guard goes out of scope.
#pragma once

namespace mg {

class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  bool raised() const;

 private:
  void (*previous_)(int);
};

}  // namespace mg
