// Fault injection for tests: make the Nth file write or the Nth allocation from now fail, so a
// test can walk N over every write of a checkpoint save or every allocation of a training step
// and show each failure leaves things consistent (the previous checkpoint intact, no leaked
// bytes). Off by default; when off a site costs one relaxed atomic load.
#pragma once
#include <cstdint>

namespace mg {

enum class FaultSite {
  file_write,  // each write()/pwrite()/fsync() of a file memgrad writes (safetensors, state.json)
  allocation,  // each CachingAllocator::allocate on any device (an OutOfMemoryError)
};

// The nth event at `site` from now (1 = the next one) fails, once; 0 turns injection off.
// Resets the site's event counter; inject_fault(site, INT64_MAX) counts events without failing.
void inject_fault(FaultSite site, int64_t nth);
// Counts one event at `site` and says whether it must fail. Called by the sites themselves.
bool fault_now(FaultSite site);
// Events counted at `site` since the last inject_fault (a test's way of finding how many there are).
int64_t fault_events(FaultSite site);

// Injects at `site` for the lifetime of the guard (tests), then turns it off.
class FaultGuard {
 public:
  FaultGuard(FaultSite site, int64_t nth) : site_(site) { inject_fault(site, nth); }
  ~FaultGuard() { inject_fault(site_, 0); }
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;

 private:
  FaultSite site_;
};

}  // namespace mg
