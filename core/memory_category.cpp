// Thread-local allocation tags: category, op name and module path.
#include "core/memory_category.h"

#include <atomic>
#include <mutex>
#include <utility>

#include "core/op_timer.h"

namespace mg {
namespace {
thread_local MemoryCategory t_category = MemoryCategory::activation;
thread_local const char* t_op_name = "";
thread_local std::string t_module_path;
thread_local StepPhase t_step_phase = StepPhase::none;
}  // namespace

std::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameter: return "parameter";
    case MemoryCategory::gradient: return "gradient";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activation: return "activation";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::input: return "input";
    case MemoryCategory::other: return "other";
  }
  return "?";
}

MemoryCategory current_memory_category() { return t_category; }
MemoryCategoryGuard::MemoryCategoryGuard(MemoryCategory c) : prev_(t_category) { t_category = c; }
MemoryCategoryGuard::~MemoryCategoryGuard() { t_category = prev_; }

const char* current_op_name() { return t_op_name; }
OpNameGuard::OpNameGuard(const char* name) : prev_(t_op_name) {
  t_op_name = name;
  if (detail::op_timer_active()) detail::op_timer_enter(this, name);  // core/op_timer.h
}
OpNameGuard::~OpNameGuard() {
  t_op_name = prev_;
  if (detail::op_timer_active()) detail::op_timer_exit(this);
}

const std::string& current_module_path() { return t_module_path; }
ModulePathGuard::ModulePathGuard(std::string_view name) : prev_len_(t_module_path.size()) {
  if (name.empty()) return;  // an unnamed (top-level) module adds nothing to the path
  if (!t_module_path.empty()) t_module_path += '.';
  t_module_path += name;
}
ModulePathGuard::~ModulePathGuard() { t_module_path.resize(prev_len_); }

ModulePathRestoreGuard::ModulePathRestoreGuard(std::string path) : prev_(std::move(t_module_path)) {
  t_module_path = std::move(path);
}
ModulePathRestoreGuard::~ModulePathRestoreGuard() { t_module_path = std::move(prev_); }

std::string_view step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::none: return "none";
    case StepPhase::forward: return "forward";
    case StepPhase::backward: return "backward";
    case StepPhase::optimizer: return "optimizer";
  }
  return "?";
}
StepPhase current_step_phase() { return t_step_phase; }
namespace {
std::mutex g_phase_listener_mu;
StepPhaseListener g_phase_listener = nullptr;
void* g_phase_listener_context = nullptr;
std::atomic<bool> g_has_phase_listener{false};

void set_phase(StepPhase p) {
  const bool changed = t_step_phase != p;
  t_step_phase = p;
  if (!changed || !g_has_phase_listener.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lk(g_phase_listener_mu);
  if (g_phase_listener) g_phase_listener(g_phase_listener_context, p);
}
}  // namespace

void set_step_phase_listener(StepPhaseListener fn, void* context) {
  std::lock_guard<std::mutex> lk(g_phase_listener_mu);
  g_phase_listener = fn;
  g_phase_listener_context = context;
  g_has_phase_listener.store(fn != nullptr);
}

StepPhaseGuard::StepPhaseGuard(StepPhase p) : prev_(t_step_phase) { set_phase(p); }
StepPhaseGuard::~StepPhaseGuard() { set_phase(prev_); }

}  // namespace mg
