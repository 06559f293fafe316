// A per-thread stand-in for the process-wide default generator. Pipeline workers run
// micro-batches on several threads at once, each drawing its dropout masks from the micro-batch's
// own stream (parallel/pipeline.h, Note [Micro-batch random streams]); while a scope is alive on a
// thread, default_generator() returns its generator there and the shared one stays untouched.
#pragma once
#include "core/rng.h"

namespace mg {

class DefaultGeneratorScope {
 public:
  explicit DefaultGeneratorScope(Generator& gen);
  ~DefaultGeneratorScope();
  DefaultGeneratorScope(const DefaultGeneratorScope&) = delete;
  DefaultGeneratorScope& operator=(const DefaultGeneratorScope&) = delete;

 private:
  Generator* prev_;
};

// This thread's stand-in, or null (read by default_generator()).
Generator* thread_default_generator();

}  // namespace mg
