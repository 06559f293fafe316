// Thread-local grad mode.
#include "autograd/grad_mode.h"

namespace mg {
namespace {
thread_local bool t_grad_enabled = true;
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

}  // namespace mg
