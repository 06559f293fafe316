// What memory is for. Every allocation is tagged with the category and the op name that are
// current on the allocating thread; the framework sets them with scoped guards (module
// construction -> parameter, autograd engine -> gradient, optimizer -> optimizer_state, data
// loader -> input, ops in forward -> activation). The profiler also records a module path.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace mg {

enum class MemoryCategory : uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,
  workspace,
  input,
  other,
};
inline constexpr int kNumMemoryCategories = 7;
inline constexpr MemoryCategory kAllMemoryCategories[] = {
    MemoryCategory::parameter, MemoryCategory::gradient, MemoryCategory::optimizer_state,
    MemoryCategory::activation, MemoryCategory::workspace, MemoryCategory::input,
    MemoryCategory::other};

std::string_view category_name(MemoryCategory c);  // "parameter", "optimizer_state", ...

// The category new allocations on this thread get. Default: activation (what ops make).
MemoryCategory current_memory_category();

class MemoryCategoryGuard {
 public:
  explicit MemoryCategoryGuard(MemoryCategory c);
  ~MemoryCategoryGuard();
  MemoryCategoryGuard(const MemoryCategoryGuard&) = delete;
  MemoryCategoryGuard& operator=(const MemoryCategoryGuard&) = delete;

 private:
  MemoryCategory prev_;
};

// The op currently allocating (a string literal, e.g. "matmul"); "" outside any op.
const char* current_op_name();

class OpNameGuard {
 public:
  explicit OpNameGuard(const char* name);
  ~OpNameGuard();
  OpNameGuard(const OpNameGuard&) = delete;
  OpNameGuard& operator=(const OpNameGuard&) = delete;

 private:
  const char* prev_;
};

// Dotted module path ("h.3.attn") of the module whose forward is running; "" at top level.
const std::string& current_module_path();

class ModulePathGuard {
 public:
  explicit ModulePathGuard(std::string_view name);  // appends ".name" (or "name" at top level)
  ~ModulePathGuard();
  ModulePathGuard(const ModulePathGuard&) = delete;
  ModulePathGuard& operator=(const ModulePathGuard&) = delete;

 private:
  size_t prev_len_;
};

// Sets the whole module path for a scope (a checkpointed segment recomputed in backward runs
// under the path it had in forward, so its allocations are attributed to the same modules).
class ModulePathRestoreGuard {
 public:
  explicit ModulePathRestoreGuard(std::string path);
  ~ModulePathRestoreGuard();
  ModulePathRestoreGuard(const ModulePathRestoreGuard&) = delete;
  ModulePathRestoreGuard& operator=(const ModulePathRestoreGuard&) = delete;

 private:
  std::string prev_;
};

// The part of a training step that is running; training loops set it with StepPhaseGuard and
// the memory profiler records it with every allocation and free.
enum class StepPhase : uint8_t { none, forward, backward, optimizer };
std::string_view step_phase_name(StepPhase p);  // "none", "forward", "backward", "optimizer"
StepPhase current_step_phase();

// One process-wide listener (the memory profiler while it records) is told every phase change,
// so phase spans have their real start and end even when no allocation happens in them. A
// listener is called on the thread that changed its phase; nullptr removes it.
using StepPhaseListener = void (*)(void* context, StepPhase now);
void set_step_phase_listener(StepPhaseListener fn, void* context);

class StepPhaseGuard {
 public:
  explicit StepPhaseGuard(StepPhase p);
  ~StepPhaseGuard();
  StepPhaseGuard(const StepPhaseGuard&) = delete;
  StepPhaseGuard& operator=(const StepPhaseGuard&) = delete;

 private:
  StepPhase prev_;
};

}  // namespace mg
