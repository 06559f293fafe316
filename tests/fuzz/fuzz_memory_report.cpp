// Fuzz target: `memgrad report` (apps/report_command.cpp) over a run directory's memory.json.
#include "apps/commands.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mg::fuzz::write_input("report/memory.json", data, size);
  try {
    mg::memory_report((mg::fuzz::work_dir() / "report").string(), 10);
  } catch (const mg::Error&) {
  }
  return 0;
}
