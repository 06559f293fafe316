// Shared pieces of the training commands (see train_common.h).
#include "apps/train_common.h"

#include <algorithm>
#include <csignal>
#include <ctime>
#include <filesystem>

#include "core/allocator.h"
#include "core/error.h"

namespace mg {

Device open_device(const std::string& device, const std::string& memory_limit) {
  Device d(device);
  MG_CHECK(!d.is_meta(), "--device meta: training needs a device with data (cpu:N or cuda:N)");
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

void PeakMeter::begin_step() { reset_peak_stats(device_); }

int64_t PeakMeter::end_step() {
  const int64_t peak = memory_stats(device_).allocated.peak;
  run_peak_ = std::max(run_peak_, peak);
  return peak;
}

int64_t PeakMeter::allocated() const { return memory_stats(device_).allocated.current; }
int64_t PeakMeter::limit() const { return int64_t(memory_limit(device_)); }

double StepTimes::stop() {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  times_.push_back(s);
  return s;
}

double StepTimes::median() const {
  if (times_.empty()) return 0.0;
  std::vector<double> t(times_.begin() + (times_.size() > 2 ? 1 : 0), times_.end());
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

double StepTimes::total() const {
  double s = 0.0;
  for (double t : times_) s += t;
  return s;
}

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

void reject_on_resume(bool given, const std::string& flag, const std::string& cmd) {
  MG_CHECK(!given, cmd, ": ", flag, " cannot be given with --resume: the run's config.json fixes it",
           "\n  hint: start a new run with --out to change it");
}

}  // namespace mg
