// A run directory: everything one training run leaves behind, so it can be inspected, sampled
// from, evaluated and continued. config.json (what rebuilds the model and continues the run),
// metrics.csv (one row per step), and checkpoint/ (model.safetensors, optimizer.safetensors,
// state.json with the step, the data loader's position and the generators' states), written as
// checkpoint.tmp.<pid>/ and swapped into place, so a crash mid-write keeps the previous one.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"
#include "data/data_loader.h"
#include "models/nn/module.h"
#include "optim/optimizer.h"

namespace mg {

// A generator's whole state: the stream (seed) and the position in it (offset).
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  static GeneratorState of(const Generator& g) { return {g.seed(), g.offset()}; }
  void restore(Generator& g) const {
    g.manual_seed(seed);
    g.set_offset(offset);
  }
};

// What a checkpoint holds besides the weights and the optimizer: where the run stands.
struct TrainingState {
  int64_t step = 0;          // optimizer steps done = the index of the next step to run
  LoaderPosition position;   // the training loader's position before step `step`
  std::map<std::string, GeneratorState> generators;  // by role, e.g. "dropout"
  double elapsed_s = 0.0;    // training time so far (the metrics' time column continues it)
  int64_t peak_bytes = 0;    // the run's peak allocated bytes so far
  nlohmann::json trainer = nlohmann::json::object();  // Trainer::state(): micro-batch, loss scale

  nlohmann::json to_json() const;
  // `source` names the file in error messages.
  static TrainingState from_json(const nlohmann::json& j, const std::string& source);
};

// Writes a folder atomically: `fill` writes files into <final_dir>.tmp.<pid>/, which then takes
// the place of `final_dir` in one rename (Linux RENAME_EXCHANGE when final_dir exists). If fill
// throws, the temporary folder is removed and `final_dir` is left untouched. Temporary folders
// of processes that no longer run (a crash mid-write) are removed on the next write.
void write_folder_atomic(const std::string& final_dir, const std::function<void(const std::string& tmp_dir)>& fill);

// A JSON file written atomically (temporary file, fsync, rename), pretty-printed.
void write_json_file(const std::string& path, const nlohmann::json& j);
// Throws naming the file when it is missing or not valid JSON.
nlohmann::json read_json_file(const std::string& path);
// Whether `j` is an object whose "format" is the string `format`. Checks every type first, so a
// file of the wrong shape is a "not a ... file" error, never a JSON type exception.
bool json_has_format(const nlohmann::json& j, std::string_view format);

class RunDir {
 public:
  explicit RunDir(std::string path) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string config_path() const { return file("config.json"); }
  std::string metrics_path() const { return file("metrics.csv"); }
  std::string checkpoint_dir() const { return file("checkpoint"); }

  void create() const;  // the folder and its parents
  bool exists() const;
  bool has_config() const;
  // A complete checkpoint folder (or the previous one, kept by an interrupted swap).
  bool has_checkpoint() const;

  void write_config(const nlohmann::json& config) const;  // creates the folder when needed
  // Throws "'<dir>' is not a run directory (no config.json)" when there is none.
  nlohmann::json read_config() const;

  // checkpoint/ = model.safetensors + optimizer.safetensors + state.json, atomically. A failed
  // write (disk full, I/O error) throws "checkpoint of step N not written: <why>" plus a line
  // naming the previous checkpoint, which is left intact.
  void save_checkpoint(const Module& model, const Optimizer& opt, const TrainingState& state) const;
  // Loads the weights (strict), the optimizer state (when `opt` is not null) and returns the
  // state. Throws "run directory '<dir>' has no checkpoint" when there is none.
  TrainingState load_checkpoint(Module& model, Optimizer* opt) const;
  // The same with the optimizer's file written / read by the caller (data-parallel ZeRO gathers
  // the state from every rank's shard first: apps/ddp_setup.h).
  using OptimizerFile = std::function<void(const std::string& path)>;
  void save_checkpoint(const Module& model, const OptimizerFile& save_optimizer, const TrainingState& state) const;
  TrainingState load_checkpoint(Module& model, const OptimizerFile& load_optimizer) const;
  // Only the checkpoint's state.json (where the run stands), without loading any tensor.
  TrainingState read_checkpoint_state() const;
  // The weights only (sampling, evaluation).
  void load_weights(Module& model) const;

 private:
  std::string checkpoint_for_reading() const;  // checkpoint/ or a surviving checkpoint.old.*
  void write_checkpoint_folder(const Module& model, const OptimizerFile& save_optimizer, const TrainingState& state) const;
  std::string path_;
};

// metrics.csv: a header row of column names, then one row per logged step. Values are written
// as given (format numbers with csv_number, which round-trips doubles exactly, so a resumed
// run's losses can be compared with an uninterrupted run's as text). Every row is flushed.
class MetricsWriter {
 public:
  // resume_from < 0: a new file. Otherwise the existing file's rows with step < resume_from are
  // kept (an interrupted run may have logged steps after its last checkpoint) and new rows are
  // appended; its header must equal `columns`. The first column must be "step".
  MetricsWriter(std::string path, std::vector<std::string> columns, int64_t resume_from = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One value per column ("" for an empty cell).
  void write(const std::vector<std::string>& values);
  const std::vector<std::string>& columns() const { return columns_; }

 private:
  std::string path_;
  std::vector<std::string> columns_;
  std::FILE* file_ = nullptr;
};

// The shortest decimal that reads back as exactly `v` ("0.1", "2.7182818284590451", "nan").
std::string csv_number(double v);
std::string csv_number(int64_t v);

// metrics.csv as rows of column -> value (tests, `vision eval`, reports). Throws naming the file.
std::vector<std::map<std::string, std::string>> read_metrics(const std::string& path);

}  // namespace mg
