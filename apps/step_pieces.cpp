// The measured time model (see step_pieces.h): timing micro-steps and updates, caching them,
// estimating a candidate's step from them.
#include "apps/step_pieces.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "apps/cost_model.h"
#include "core/error.h"
#include "core/parallel.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

int64_t micro_batch_of(const PlanWorkload& w, const TechniqueOptions& t) {
  return t.micro_batch > 0 ? std::min(t.micro_batch, w.batch) : w.batch;
}

std::string workload_key(const PlanWorkload& w) {
  std::string key = w.name + " " + std::to_string(w.num_parameters()) + " params ";
  if (w.is_gpt()) key += 'x' + std::to_string(w.gpt->context) + " tokens ";
  else key += "images ";
  return key + optimizer_kind_name(w.optimizer) + " clip " + std::to_string(w.grad_clip);
}

std::string cache_path(bool cpu_time) {
  const std::string name = "steps-" + std::to_string(num_threads()) + "threads-" + (cpu_time ? "cpu" : "wall");
  return (fs::path(memgrad_cache_dir()) / (name + ".json")).string();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

std::string StepPieces::micro_key(const PlanWorkload& w, const TechniqueOptions& t, const ModelParallelOptions& parallel) {
  TechniqueOptions shape = t;
  shape.micro_batch = 0;
  std::string key = workload_key(w) + " | micro-batch " + std::to_string(micro_batch_of(w, t)) + " " +
                    shape.to_json().dump();
  if (!parallel.active()) return key;
  key += " | " + parallel.str();
  if (!parallel.balance_budgets.empty()) {
    key += " against";
    for (int64_t b : parallel.balance_budgets) {
      key += ' ';
      key += std::to_string(b);
    }
  }
  return key;
}

std::string StepPieces::update_key(const PlanWorkload& w, Precision p) {
  return workload_key(w) + " | update " + precision_name(p);
}

std::optional<double> StepPieces::estimate_ms(const PlanWorkload& w, const TechniqueOptions& t,
                                              const ModelParallelOptions& parallel) const {
  const auto micro = micro_ms.find(micro_key(w, t, parallel));
  const auto update = update_ms.find(update_key(w, t.precision));
  if (micro == micro_ms.end() || update == update_ms.end()) return std::nullopt;
  const double micro_steps = double(w.batch) / double(micro_batch_of(w, t));
  return micro_steps * micro->second + update->second;
}

StepPieces StepPieces::cached(bool cpu_time) {
  StepPieces p;
  p.cpu_time = cpu_time;
  try {  // a cache that is missing, unreadable or for another CPU holds nothing
    std::ifstream f(cache_path(cpu_time));
    if (!f) return p;
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.at("cpu").get<std::string>() != cpu_model_name() || j.at("threads").get<int>() != num_threads()) return p;
    p.micro_ms = j.at("micro_ms").get<std::map<std::string, double>>();
    p.update_ms = j.at("update_ms").get<std::map<std::string, double>>();
    p.path = cache_path(cpu_time);
  } catch (const std::exception&) {
    p.micro_ms.clear();
    p.update_ms.clear();
  }
  return p;
}

void StepPieces::save() {
  const std::string target = cache_path(cpu_time);
  const nlohmann::json j{{"cpu", cpu_model_name()}, {"threads", num_threads()}, {"micro_ms", micro_ms},
                         {"update_ms", update_ms}};
  std::error_code ec;
  fs::create_directories(fs::path(target).parent_path(), ec);
  std::ofstream out(target + ".tmp");
  path.clear();
  if (ec || !out) return;
  out << j.dump(2) << "\n";
  out.close();
  fs::rename(target + ".tmp", target, ec);
  if (!ec) path = target;
}

void measure_step_pieces(const PlanWorkload& w, const std::vector<PieceShape>& candidates,
                         const Device& device, int rounds, StepPieces& pieces) {
  MG_CHECK(rounds >= 1, "plan: --calibrate-rounds must be at least 1, got ", rounds);
  const auto t0 = std::chrono::steady_clock::now();
  for (const PieceShape& c : candidates) {
    const std::string key = StepPieces::update_key(w, c.techniques.precision);
    if (pieces.update_ms.count(key)) continue;
    pieces.update_ms[key] = measure_update_ms(w, c.techniques.precision, device, pieces.cpu_time);
    ++pieces.timed_now;
  }
  // The missing micro-step shapes, each once: a one-micro-batch workload without accumulation.
  std::map<std::string, PlanWorkload> workloads;
  std::map<std::string, PieceShape> missing;
  for (const PieceShape& c : candidates) {
    const std::string key = StepPieces::micro_key(w, c.techniques, c.parallel);
    if (pieces.micro_ms.count(key) || missing.count(key)) continue;
    PlanWorkload one_micro_batch = w;
    one_micro_batch.batch = micro_batch_of(w, c.techniques);
    PieceShape whole = c;
    whole.techniques.micro_batch = 0;
    workloads.emplace(key, one_micro_batch);
    missing.emplace(key, whole);
  }
  std::map<std::string, std::vector<double>> times;
  for (int r = 0; r < rounds; ++r)
    for (const auto& [key, shape] : missing) {  // a warm-up step, then the timed one
      const StepMeasurement m = measure_step(workloads.at(key), shape.techniques, device, 2, {}, shape.parallel);
      times[key].push_back((pieces.cpu_time ? m.timed_cpu_ms : m.timed_ms).at(0));
    }
  for (const auto& [key, shape] : missing) {
    const double step = median(times.at(key));
    const double update = pieces.update_ms.at(StepPieces::update_key(w, shape.techniques.precision));
    // A step of one micro-batch is that micro-step and an update; noise can make the update
    // look as long as the step, so the micro-step keeps at least half the step.
    pieces.micro_ms[key] = std::max(step - update, 0.5 * step);
    ++pieces.timed_now;
  }
  pieces.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace mg
