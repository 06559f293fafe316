// A tiny GPT training loop (forward / backward / optimizer phases set with StepPhaseGuard, AdamW)
// run under a MemoryProfiler, shared by the profiler, HTML and report tests.
#pragma once
#include <vector>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/memory_profiler.h"
#include "core/tensor.h"
#include "models/gpt.h"
#include "optim/adam.h"

namespace mg::test {

// Trains `steps` steps of a tiny GPT on device d with the profiler recording; the allocator's
// peak statistic is reset right before start() so it covers exactly the profiled span.
inline void profile_tiny_gpt(MemoryProfiler& prof, Device d, int steps) {
  GPTConfig cfg{.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32};
  Generator gen(7);
  GPT model(cfg, {.gen = &gen, .device = d});
  std::vector<int64_t> x, y;
  for (int i = 0; i < 2 * 16; ++i) {
    x.push_back(int64_t((i * 7 + i / 5) % 32));
    y.push_back(int64_t((i * 7 + i / 5 + 3) % 32));
  }
  TensorOptions opts{.dtype = DType::i64, .device = d};
  Tensor idx = from_vector(x, {2, 16}, opts), targets = from_vector(y, {2, 16}, opts);
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-3, 0.01));
  reset_peak_stats(d);
  prof.start();
  for (int s = 0; s < steps; ++s) {
    Tensor loss;
    {
      StepPhaseGuard g(StepPhase::forward);
      loss = model.loss(idx, targets);
    }
    {
      StepPhaseGuard g(StepPhase::backward);
      backward(loss);
      loss = Tensor();
    }
    {
      StepPhaseGuard g(StepPhase::optimizer);
      opt.step();
      opt.zero_grad();
    }
  }
  prof.stop();
}

}  // namespace mg::test
