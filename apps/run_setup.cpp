// Devices and run directories for the commands (see run_setup.h).
#include "apps/run_setup.h"

#include <ctime>
#include <filesystem>

#include "core/allocator.h"
#include "core/error.h"

namespace mg {

Device open_device(const std::string& device, const std::string& memory_limit) {
  Device d(device);
  MG_CHECK(!d.is_meta(), "--device meta: training needs a device with data (cpu:N or cuda:N)");
  MG_CHECK(d != kHostData, "--device ", d.str(), ": that pool holds the datasets; train on another cpu index");
  if (d.is_cuda())
    MG_CHECK(backend_available(DeviceType::cuda), "--device ", device, ": no CUDA backend in this memgrad");
  if (!memory_limit.empty()) set_memory_limit(d, parse_bytes(memory_limit));
  return d;
}

RunDir new_run_dir(const std::string& out, const std::string& prefix, const std::string& cmd) {
  std::string path = out;
  if (path.empty()) {
    char stamp[32];
    std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
    path = "runs/" + prefix + "-" + stamp;
  }
  RunDir run(path);
  MG_CHECK(!std::filesystem::exists(path) || run.exists(), cmd, ": --out '", path, "' exists and is not a folder");
  MG_CHECK(!run.has_checkpoint(), cmd, ": run directory '", path, "' already holds a checkpoint",
           "\n  hint: continue it with --resume ", path, ", or choose another --out");
  return run;  // created once the run's settings are checked (RunDir::write_config)
}

RunDir existing_run_dir(const std::string& path, const std::string& cmd) {
  MG_CHECK(!path.empty(), cmd, ": no run directory given");
  RunDir run(path);
  MG_CHECK(run.exists(), cmd, ": run directory '", path, "' does not exist");
  MG_CHECK(run.has_config(), cmd, ": '", path, "' is not a run directory (it has no config.json)");
  MG_CHECK(run.has_checkpoint(), cmd, ": run directory '", path, "' has no checkpoint (no complete ", path,
           "/checkpoint/)", "\n  hint: a run writes one every --checkpoint-every steps and when it ends");
  return run;
}

RunDir resume_run_dir(const std::string& path, const std::string& cmd) {
  return existing_run_dir(path, cmd + " --resume");
}

Generator& dropout_generator() { return default_generator(); }

void reject_on_resume(bool given, const std::string& flag, const std::string& cmd) {
  MG_CHECK(!given, cmd, ": ", flag, " cannot be given with --resume: the run's config.json fixes it",
           "\n  hint: start a new run with --out to change it");
}

}  // namespace mg
