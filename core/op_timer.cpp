// Per-op self times (see op_timer.h). Each thread keeps a stack of the named scopes it has open;
// closing one adds its wall time minus its children's to a process-wide table under a mutex (only
// while timing is on). MG_PROFILE_OPS=1 switches timing on at start-up and prints the table to
// stderr when the process exits, for any memgrad program.
#include "core/op_timer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace mg {
namespace {

using Clock = std::chrono::steady_clock;

struct Frame {
  const void* owner;
  const char* name;
  Clock::time_point start;
  double child_ms;  // wall time of the named scopes nested directly in this one
};

struct Table {
  std::mutex mu;
  std::unordered_map<std::string, OpTime> times;
};
Table& table() {
  static Table* t = new Table;  // never destroyed: scopes may close during static destruction
  return *t;
}

bool env_on() {
  const char* v = std::getenv("MG_PROFILE_OPS");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

std::atomic<bool> g_on{false};
thread_local int t_depth = 0;  // trivially initialised: the cheap check in op_timer_active()
thread_local std::vector<Frame> t_stack;

void print_at_exit() { std::fputs(op_time_table(0, 0).c_str(), stderr); }

// MG_PROFILE_OPS read once at load time.
const bool g_env_init = [] {
  if (!env_on()) return false;
  g_on.store(true);
  std::atexit(print_at_exit);
  return true;
}();

}  // namespace

void set_op_timing(bool on) { g_on.store(on, std::memory_order_relaxed); }
bool op_timing_enabled() { return g_on.load(std::memory_order_relaxed); }

void reset_op_times() {
  std::lock_guard<std::mutex> lock(table().mu);
  table().times.clear();
}

std::vector<OpTime> op_times() {
  std::vector<OpTime> out;
  {
    std::lock_guard<std::mutex> lock(table().mu);
    for (const auto& [name, t] : table().times) out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return out;
}

std::string op_time_table(double total_ms, int steps) {
  const std::vector<OpTime> times = op_times();
  double named = 0;
  for (const OpTime& t : times) named += t.self_ms;
  const double whole = total_ms > 0 ? total_ms : named;
  const int per = std::max(steps, 1);
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-34s %9s %11s %11s %7s\n", "op (self time)", "calls", "total ms", "ms/step", "%");
  out += line;
  auto row = [&](const std::string& name, int64_t calls, double ms) {
    std::snprintf(line, sizeof line, "%-34s %9lld %11.3f %11.3f %6.1f%%\n", name.c_str(), (long long)calls, ms,
                  ms / per, whole > 0 ? 100.0 * ms / whole : 0.0);
    out += line;
  };
  for (const OpTime& t : times) row(t.name.empty() ? "(unnamed scope)" : t.name, t.calls, t.self_ms);
  if (total_ms > 0) row("(outside named ops)", 0, total_ms - named);
  return out;
}

namespace detail {

bool op_timer_active() { return t_depth > 0 || g_on.load(std::memory_order_relaxed); }

void op_timer_enter(const void* owner, const char* name) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  t_stack.push_back(Frame{owner, name, Clock::now(), 0.0});
  ++t_depth;
}

void op_timer_exit(const void* owner) {
  if (t_stack.empty() || t_stack.back().owner != owner) return;  // opened before timing was on
  const Frame f = t_stack.back();
  t_stack.pop_back();
  --t_depth;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - f.start).count();
  if (!t_stack.empty()) t_stack.back().child_ms += ms;
  if (!g_on.load(std::memory_order_relaxed)) return;  // switched off meanwhile: not recorded
  std::lock_guard<std::mutex> lock(table().mu);
  OpTime& t = table().times[f.name];
  if (t.calls == 0) t.name = f.name;
  t.calls += 1;
  t.self_ms += ms - f.child_ms;
}

}  // namespace detail
}  // namespace mg
