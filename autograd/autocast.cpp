// The thread-local autocast state and its guard (see autograd/autocast.h, Note [Autocast]).
#include "autograd/autocast.h"

namespace mg {
namespace {
thread_local AutocastState t_state;
}  // namespace

AutocastState autocast_state() { return t_state; }

void set_autocast_state(AutocastState s) {
  MG_CHECK(!s.enabled || s.dtype == DType::f16 || s.dtype == DType::bf16,
           "autocast: the low-precision dtype must be f16 or bf16, got ", s.dtype);
  t_state = s;
}

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_(t_state) {
  set_autocast_state({.enabled = enabled, .dtype = dtype});
}

AutocastGuard::~AutocastGuard() { t_state = prev_; }

}  // namespace mg
