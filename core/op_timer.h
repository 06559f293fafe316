// Per-op wall time, for finding where a training step's time goes. While timing is on
// (set_op_timing(true), or MG_PROFILE_OPS=1 in the environment at start-up), every OpNameGuard
// scope (forward ops and the autograd engine's backward nodes) records its *self* time: its wall
// time minus that of the named scopes nested in it, so the self times add up to the time spent
// inside named scopes without counting anything twice. Off, it costs one relaxed atomic load per op.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mg {

struct OpTime {
  std::string name;  // the OpNameGuard name: "matmul", "MatmulBackward", ...
  int64_t calls = 0;
  double self_ms = 0;  // summed over calls, on the threads that opened the scopes
};

void set_op_timing(bool on);
bool op_timing_enabled();
void reset_op_times();
std::vector<OpTime> op_times();  // largest self time first

// A table of op_times(): name, calls, total ms, ms per step and % of `total_ms` (the wall time the
// caller measured over `steps` steps); a last row "(outside named ops)" holds the rest.
std::string op_time_table(double total_ms, int steps);

namespace detail {
// Called by OpNameGuard only: `owner` identifies the guard so that a guard opened before timing
// was switched on is not closed by the timer.
void op_timer_enter(const void* owner, const char* name);
void op_timer_exit(const void* owner);
bool op_timer_active();  // cheap: timing on, or scopes still open on this thread
}  // namespace detail

}  // namespace mg
