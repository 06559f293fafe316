// Shared pieces of the training commands (see train_common.h).
#include "apps/train_common.h"

#include <algorithm>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <optional>

#include "core/allocator.h"
#include "core/memory_profiler.h"
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
  const MemoryStats st = memory_stats(device_);
  const int64_t peak = st.allocated.peak;
  run_peak_ = std::max(run_peak_, peak);
  if (++steps_ == 2) steady_ = {};  // the first step (warm-up) counts only while it is alone
  steady_.total = std::max(steady_.total, peak);
  steady_.reserved = std::max(steady_.reserved, st.reserved.peak);
  for (MemoryCategory c : kAllMemoryCategories)
    steady_.category[size_t(c)] = std::max(steady_.category[size_t(c)], st.category(c).peak);
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

StepMemory StepMemory::of(const PeakMeter& m) {
  StepMemory s{m.steady_peak(), m.steady_reserved_peak(), {}};
  for (MemoryCategory c : kAllMemoryCategories) s.category[size_t(c)] = m.steady_category_peak(c);
  return s;
}

// ---- techniques ---------------------------------------------------------------------------------

void TechniqueOptions::validate(int64_t batch, const Device& train_device) const {
  checkpoint_policy();  // throws naming a bad policy
  parse_precision(precision);
  MG_CHECK(micro_batch >= 0, "--micro-batch must be >= 0 (0: the whole batch), got ", micro_batch);
  MG_CHECK(micro_batch <= batch, "--micro-batch (", micro_batch, ") cannot exceed --batch (", batch, ")");
  if (!offload_activations.empty()) {
    Device d(offload_activations);
    MG_CHECK(!d.is_meta() && d != train_device, "--offload-activations ", offload_activations,
             ": needs another device with data than the training device ", train_device.str(),
             "\n  hint: use cpu:1 when training on cpu:0, cpu:0 when training on cuda:0");
  }
}

TrainerOptions TechniqueOptions::trainer_options(double grad_clip) const {
  TrainerOptions t;
  t.micro_batch = micro_batch;
  t.auto_fit = auto_fit;
  t.precision = parse_precision(precision);
  t.grad_clip = grad_clip;
  if (!offload_activations.empty()) t.offload_activations = Device(offload_activations);
  return t;
}

struct StepProfiler::Impl {
  std::optional<MemoryProfiler> profiler;
  int64_t step = -1;
};

StepProfiler::StepProfiler(const TechniqueOptions& t, const Device& device, int64_t first_step, int64_t last_step)
    : impl_(std::make_unique<Impl>()) {
  if (!t.profile || first_step >= last_step) return;
  std::vector<Device> devices{device};
  if (!t.offload_activations.empty()) devices.emplace_back(t.offload_activations);
  impl_->profiler.emplace(devices);
  impl_->step = last_step - first_step > 1 ? first_step + 1 : first_step;
}

StepProfiler::~StepProfiler() = default;

void StepProfiler::before_step(int64_t step) {
  if (impl_->profiler && step == impl_->step) impl_->profiler->start();
}

std::string StepProfiler::after_step(int64_t step, const std::string& run_dir) {
  if (!impl_->profiler || step != impl_->step || !impl_->profiler->active()) return "";
  impl_->profiler->stop();
  impl_->profiler->write(run_dir);
  const MemoryProfileSummary s = impl_->profiler->summary();
  const DeviceMemoryProfile& d = s.devices.front();
  return "memory profile of step " + std::to_string(step + 1) + ": peak " + format_bytes(d.peak_bytes) + " in " +
         std::string(step_phase_name(d.peak_phase)) + " -> " + run_dir + "/memory.html (memgrad report " + run_dir + ")";
}

std::string TechniqueOptions::str() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (checkpoint != "none") add("checkpoint=" + checkpoint);
  if (precision != "fp32") add(precision);
  if (micro_batch > 0) add("micro-batch=" + std::to_string(micro_batch));
  if (auto_fit) add("auto-fit");
  if (!offload_activations.empty()) add("offload=" + offload_activations);
  return s.empty() ? "none" : s;
}

nlohmann::json TechniqueOptions::to_json() const {
  return {{"checkpoint", checkpoint}, {"precision", precision}, {"micro_batch", micro_batch},
          {"offload_activations", offload_activations}};
}

TechniqueOptions TechniqueOptions::from_config(const nlohmann::json& config) const {
  TechniqueOptions t;
  t.auto_fit = auto_fit;
  t.profile = profile;
  if (!config.contains("techniques")) return t;
  try {
    const auto& j = config.at("techniques");
    t.checkpoint = j.at("checkpoint").get<std::string>();
    t.precision = j.at("precision").get<std::string>();
    t.micro_batch = j.at("micro_batch").get<int64_t>();
    t.offload_activations = j.at("offload_activations").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    MG_THROW("config.json: 'techniques' is malformed: ", e.what());
  }
  return t;
}

}  // namespace mg
