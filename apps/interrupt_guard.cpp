// The SIGINT flag of InterruptGuard (see interrupt_guard.h).
#include "apps/interrupt_guard.h"

#include <csignal>

namespace mg {

namespace {
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) {
  g_interrupted = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C stops at once
}
}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  previous_ = std::signal(SIGINT, on_sigint);
}
InterruptGuard::~InterruptGuard() { std::signal(SIGINT, previous_ == SIG_ERR ? SIG_DFL : previous_); }
bool InterruptGuard::raised() const { return g_interrupted != 0; }

}  // namespace mg
