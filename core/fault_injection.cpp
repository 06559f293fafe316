// Fault injection (see fault_injection.h): per site, an armed flag, the event that must fail and
// an event counter. Counting happens only while a site is armed or being counted, so the
// production path is one relaxed load of `armed`.
#include "core/fault_injection.h"

#include <atomic>

namespace mg {
namespace {

struct SiteState {
  std::atomic<bool> armed{false};  // counting events (an injection is pending or a count is wanted)
  std::atomic<int64_t> fail_at{0};
  std::atomic<int64_t> events{0};
};

SiteState& state(FaultSite site) {
  static SiteState sites[2];
  return sites[int(site)];
}

}  // namespace

void inject_fault(FaultSite site, int64_t nth) {
  SiteState& s = state(site);
  s.armed.store(false);
  s.events.store(0);
  s.fail_at.store(nth);
  s.armed.store(nth > 0);
}

bool fault_now(FaultSite site) {
  SiteState& s = state(site);
  if (!s.armed.load(std::memory_order_relaxed)) [[likely]]
    return false;
  const int64_t n = s.events.fetch_add(1) + 1;
  return n == s.fail_at.load();
}

int64_t fault_events(FaultSite site) { return state(site).events.load(); }

}  // namespace mg
