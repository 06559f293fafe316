// The run directory (see run_dir.h): config.json, metrics.csv and the atomic checkpoint folder.
//
// Note [Checkpoint swap] A checkpoint is complete or absent, never half there. Its files are
// written and fsynced inside checkpoint.tmp.<pid>/, then one renameat2(RENAME_EXCHANGE) swaps
// that folder with checkpoint/ (a plain rename when there is none yet), and the old one, now
// under the temporary name, is deleted. On a filesystem without RENAME_EXCHANGE the swap is two
// renames (checkpoint/ -> checkpoint.old.<pid>/, tmp -> checkpoint/); a crash between them
// leaves checkpoint.old.<pid>/, which readers then use. state.json is written last, so a
// folder without it is never taken for a checkpoint.
#include "apps/run_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fault_injection.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFormat = "memgrad-checkpoint";
constexpr int kStateVersion = 1;
const char* const kCheckpointFiles[] = {"model.safetensors", "optimizer.safetensors", "state.json"};

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return;  // best effort: the data is written, only its durability is in question
  ::fsync(fd);
  ::close(fd);
}

void write_text_synced(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  MG_CHECK(f != nullptr, "cannot create '", path, "': ", std::strerror(errno));
  errno = 0;
  const bool injected = fault_now(FaultSite::file_write);  // tests: an I/O error here (EIO)
  bool ok = !injected && std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
            ::fsync(::fileno(f)) == 0;
  int err = ok ? 0 : injected || errno == 0 ? EIO : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  MG_CHECK(ok, "cannot write '", path, "': ", std::strerror(err));
}

// A leftover "<name>.tmp.<pid>" / "<name>.old.<pid>" of a process that no longer runs.
bool is_stale(const fs::path& p, const std::string& prefix) {
  std::string name = p.filename().string();
  if (name.rfind(prefix, 0) != 0) return false;
  long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
  if (pid <= 0) return false;
  if (pid == long(::getpid())) return true;  // ours: a leftover of an earlier failed write
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

bool complete_checkpoint(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : kCheckpointFiles)
    if (!fs::is_regular_file(dir / f, ec)) return false;
  return true;
}

// state.json carries "xxh3": the XXH3-64 of the compact JSON of everything else (Note [Checksums]).
// nlohmann's dump is canonical (sorted keys, shortest round-trip numbers), so a parsed file
// dumps to the same text it was hashed from.
constexpr const char* kJsonChecksumKey = "xxh3";

std::string json_checksum(nlohmann::json j) {
  j.erase(kJsonChecksumKey);
  const std::string text = j.dump();
  return checksum_hex(checksum64(text.data(), text.size()));
}

// The checkpoint's state.json, its checksum verified (a file without one, from before
// checksums, is accepted).
nlohmann::json read_state_json(const std::string& path) {
  nlohmann::json j = read_json_file(path);
  if (j.is_object() && j.contains(kJsonChecksumKey)) {
    const nlohmann::json& stored = j[kJsonChecksumKey];
    const std::string actual = json_checksum(j);
    MG_CHECK(stored.is_string() && stored.get<std::string>() == actual, "checkpoint state '", path,
             "' is corrupt: its content hashes to xxh3 ", actual, ", the file recorded ", stored.dump(),
             "\n  hint: the file was damaged or edited after it was written; restore it or use an earlier checkpoint");
  }
  return j;
}

uint64_t get_u64(const nlohmann::json& j, const char* key, const std::string& source) {
  const bool ok = j.contains(key) && j[key].is_number_integer() &&
                  (j[key].is_number_unsigned() || j[key].get<int64_t>() >= 0);
  MG_CHECK(ok, "checkpoint state '", source, "': '", key,
           "' is missing or not a non-negative integer");
  return j[key].get<uint64_t>();
}

}  // namespace

// ---- TrainingState ------------------------------------------------------------------------

nlohmann::json TrainingState::to_json() const {
  nlohmann::json gens = nlohmann::json::object();
  for (const auto& [role, g] : generators) gens[role] = {{"seed", g.seed}, {"offset", g.offset}};
  return {{"format", kStateFormat},
          {"version", kStateVersion},
          {"step", step},
          {"loader", {{"epoch", position.epoch}, {"batch", position.batch}}},
          {"generators", gens},
          {"elapsed_s", elapsed_s},
          {"peak_bytes", peak_bytes},
          {"trainer", trainer}};
}

TrainingState TrainingState::from_json(const nlohmann::json& j, const std::string& source) {
  MG_CHECK(json_has_format(j, kStateFormat), "checkpoint state '", source,
           "' is not a memgrad checkpoint state (format '", kStateFormat, "' expected)");
  MG_CHECK(j.value("version", 0) == kStateVersion, "checkpoint state '", source, "' has version ",
           j.value("version", 0), "; this memgrad reads version ", kStateVersion);
  TrainingState s;
  s.step = int64_t(get_u64(j, "step", source));
  MG_CHECK(j.contains("loader") && j["loader"].is_object(), "checkpoint state '", source, "': 'loader' is missing");
  s.position.epoch = int64_t(get_u64(j["loader"], "epoch", source));
  s.position.batch = int64_t(get_u64(j["loader"], "batch", source));
  MG_CHECK(j.contains("generators") && j["generators"].is_object(), "checkpoint state '", source,
           "': 'generators' is missing");
  for (const auto& [role, g] : j["generators"].items())
    s.generators[role] = {get_u64(g, "seed", source), get_u64(g, "offset", source)};
  s.elapsed_s = j.value("elapsed_s", 0.0);
  s.peak_bytes = j.value("peak_bytes", int64_t(0));
  if (j.contains("trainer")) {
    MG_CHECK(j["trainer"].is_object(), "checkpoint state '", source, "': 'trainer' must be an object");
    s.trainer = j["trainer"];
  }
  return s;
}

// ---- atomic files and folders -------------------------------------------------------------

void write_folder_atomic(const std::string& final_dir, const std::function<void(const std::string&)>& fill) {
  const fs::path final_path(final_dir);
  const fs::path parent = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  const std::string name = final_path.filename().string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  MG_CHECK(fs::is_directory(parent), "cannot create folder '", parent.string(), "': ", ec.message());
  // Leftovers of crashed writers (Note [Checkpoint swap]).
  for (const auto& entry : fs::directory_iterator(parent, ec))
    if (is_stale(entry.path(), name + ".tmp.")) fs::remove_all(entry.path(), ec);

  const fs::path tmp = parent / (name + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  MG_CHECK(fs::create_directory(tmp, ec), "cannot create folder '", tmp.string(), "': ", ec.message());
  try {
    fill(tmp.string());
    for (const auto& entry : fs::directory_iterator(tmp)) fsync_path(entry.path().string(), false);
    fsync_path(tmp.string(), true);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }

  if (!fs::exists(final_path)) {
    MG_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0, "cannot rename '", tmp.string(), "' to '", final_dir,
             "': ", std::strerror(errno));
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now holds the previous folder
  } else {
    MG_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "cannot swap '", tmp.string(), "' with '",
             final_dir, "': ", std::strerror(errno));
    const fs::path old = parent / (name + ".old." + std::to_string(::getpid()));
    fs::remove_all(old, ec);
    MG_CHECK(::rename(final_path.c_str(), old.c_str()) == 0, "cannot rename '", final_dir, "': ", std::strerror(errno));
    MG_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0, "cannot rename '", tmp.string(), "' to '", final_dir,
             "': ", std::strerror(errno));
    fs::remove_all(old, ec);
  }
  fsync_path(parent.string(), true);
  // A previous folder a crashed two-rename swap left behind is superseded now.
  for (const auto& entry : fs::directory_iterator(parent, ec))
    if (is_stale(entry.path(), name + ".old.")) fs::remove_all(entry.path(), ec);
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_text_synced(tmp, j.dump(2) + "\n");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  MG_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path, "': ",
           std::strerror(errno));
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream f(path);
  MG_CHECK(f.good(), "cannot read '", path, "': ", fs::exists(path) ? "permission denied" : "no such file");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MG_THROW("'", path, "' is not valid JSON: ", e.what());
  }
}

bool json_has_format(const nlohmann::json& j, std::string_view format) {
  if (!j.is_object()) return false;
  const auto it = j.find("format");
  return it != j.end() && it->is_string() && it->get_ref<const std::string&>() == format;
}

// ---- RunDir -------------------------------------------------------------------------------

void RunDir::create() const {
  std::error_code ec;
  fs::create_directories(path_, ec);
  MG_CHECK(fs::is_directory(path_), "cannot create run directory '", path_, "'",
           ec ? ": " + ec.message() : std::string());
}

bool RunDir::exists() const { return fs::is_directory(path_); }
bool RunDir::has_config() const { return fs::is_regular_file(config_path()); }
bool RunDir::has_checkpoint() const { return !checkpoint_for_reading().empty(); }

void RunDir::write_config(const nlohmann::json& config) const {
  create();
  write_json_file(config_path(), config);
}

nlohmann::json RunDir::read_config() const {
  MG_CHECK(exists(), "run directory '", path_, "' does not exist");
  MG_CHECK(has_config(), "'", path_, "' is not a run directory (it has no config.json)");
  return read_json_file(config_path());
}

std::string RunDir::checkpoint_for_reading() const {
  if (complete_checkpoint(checkpoint_dir())) return checkpoint_dir();
  std::error_code ec;
  if (fs::exists(checkpoint_dir(), ec) || !exists()) return "";
  // The swap was interrupted between its two renames (Note [Checkpoint swap]).
  for (const auto& entry : fs::directory_iterator(path_, ec))
    if (entry.path().filename().string().rfind("checkpoint.old.", 0) == 0 && complete_checkpoint(entry.path()))
      return entry.path().string();
  return "";
}

void RunDir::save_checkpoint(const Module& model, const Optimizer& opt, const TrainingState& state) const {
  save_checkpoint(model, [&](const std::string& path) { opt.save(path); }, state);
}

void RunDir::save_checkpoint(const Module& model, const OptimizerFile& save_optimizer, const TrainingState& state) const {
  create();
  try {
    write_checkpoint_folder(model, save_optimizer, state);
  } catch (const OutOfMemoryError&) {
    throw;  // staging a device tensor ran out: the caller's out-of-memory handling applies
  } catch (const Error& e) {
    // Note [Checkpoint swap]: a failed write never touched the previous checkpoint; say which it is.
    std::string previous = "there is no previous checkpoint";
    try {
      if (has_checkpoint())
        previous = "the previous checkpoint (step " + std::to_string(read_checkpoint_state().step) + ", " +
                   checkpoint_for_reading() + ") is intact";
    } catch (const Error&) {
      previous = "the previous checkpoint folder " + checkpoint_for_reading() + " was not touched";
    }
    MG_THROW("checkpoint of step ", state.step, " not written: ", e.what(), "\n  ", previous);
  }
}

void RunDir::write_checkpoint_folder(const Module& model, const OptimizerFile& save_optimizer,
                                     const TrainingState& state) const {
  write_folder_atomic(checkpoint_dir(), [&](const std::string& tmp) {
    model.save(tmp + "/model.safetensors");
    save_optimizer(tmp + "/optimizer.safetensors");
    nlohmann::json j = state.to_json();
    j[kJsonChecksumKey] = json_checksum(j);
    write_text_synced(tmp + "/state.json", j.dump(2) + "\n");  // last: marks it complete
  });
}

TrainingState RunDir::load_checkpoint(Module& model, Optimizer* opt) const {
  return load_checkpoint(model, [&](const std::string& path) {
    if (opt) opt->load(path);
  });
}

TrainingState RunDir::load_checkpoint(Module& model, const OptimizerFile& load_optimizer) const {
  const std::string dir = checkpoint_for_reading();
  MG_CHECK(!dir.empty(), "run directory '", path_, "' has no checkpoint (no complete ", checkpoint_dir(),
           "/ with model.safetensors, optimizer.safetensors and state.json)",
           "\n  hint: a run writes its first checkpoint after --checkpoint-every steps and at its end");
  TrainingState s = TrainingState::from_json(read_state_json(dir + "/state.json"), dir + "/state.json");
  model.load(dir + "/model.safetensors", /*strict=*/true);
  load_optimizer(dir + "/optimizer.safetensors");
  return s;
}

TrainingState RunDir::read_checkpoint_state() const {
  const std::string dir = checkpoint_for_reading();
  MG_CHECK(!dir.empty(), "run directory '", path_, "' has no checkpoint (no complete ", checkpoint_dir(), "/)");
  return TrainingState::from_json(read_state_json(dir + "/state.json"), dir + "/state.json");
}

void RunDir::load_weights(Module& model) const {
  const std::string dir = checkpoint_for_reading();
  MG_CHECK(!dir.empty(), "run directory '", path_, "' has no checkpoint (no complete ", checkpoint_dir(), "/)");
  model.load(dir + "/model.safetensors", /*strict=*/true);
}

// ---- metrics.csv --------------------------------------------------------------------------

namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream is(line);
  while (std::getline(is, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

std::string join_csv(const std::vector<std::string>& cells) {
  std::string s;
  for (size_t i = 0; i < cells.size(); ++i) s += (i ? "," : "") + cells[i];
  return s + "\n";
}

}  // namespace

MetricsWriter::MetricsWriter(std::string path, std::vector<std::string> columns, int64_t resume_from)
    : path_(std::move(path)), columns_(std::move(columns)) {
  MG_CHECK(!columns_.empty() && columns_[0] == "step", "MetricsWriter: the first column must be 'step'");
  std::string kept = join_csv(columns_);
  if (resume_from >= 0 && fs::exists(path_)) {
    std::ifstream f(path_);
    std::string line;
    std::getline(f, line);
    MG_CHECK(split_csv_line(line) == columns_, "metrics file '", path_, "' has columns '", line, "', expected '",
             join_csv(columns_).substr(0, join_csv(columns_).size() - 1), "'");
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      // A row cut short by a crash has no usable step; rows past the checkpoint are replaced.
      const std::string step = split_csv_line(line)[0];
      int64_t s = -1;
      auto [p, err] = std::from_chars(step.data(), step.data() + step.size(), s);
      if (err == std::errc() && p == step.data() + step.size() && s < resume_from) kept += line + "\n";
    }
  }
  // Temp file + rename: a kill -9 between truncating and rewriting the file would otherwise leave
  // it empty and the next resume without a header (found by tests/apps/test_kill9.cpp).
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  write_text_synced(tmp, kept);
  MG_CHECK(::rename(tmp.c_str(), path_.c_str()) == 0, "cannot rename '", tmp, "' to '", path_, "': ",
           std::strerror(errno));
  file_ = std::fopen(path_.c_str(), "ab");
  MG_CHECK(file_ != nullptr, "cannot open '", path_, "' for appending: ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const std::vector<std::string>& values) {
  MG_CHECK(values.size() == columns_.size(), "MetricsWriter: ", values.size(), " values for ", columns_.size(),
           " columns of '", path_, "'");
  const std::string line = join_csv(values);
  MG_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
           "cannot write '", path_, "': ", std::strerror(errno));
}

std::string csv_number(double v) {
  char buf[64];
  auto [end, err] = std::to_chars(buf, buf + sizeof(buf), v);
  return err == std::errc() ? std::string(buf, end) : std::string("nan");
}

std::string csv_number(int64_t v) { return std::to_string(v); }

std::vector<std::map<std::string, std::string>> read_metrics(const std::string& path) {
  std::ifstream f(path);
  MG_CHECK(f.good(), "cannot read metrics file '", path, "'");
  std::string line;
  MG_CHECK(bool(std::getline(f, line)), "metrics file '", path, "' is empty (no header row)");
  const std::vector<std::string> header = split_csv_line(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    std::vector<std::string> cells = split_csv_line(line);
    MG_CHECK(cells.size() == header.size(), "metrics file '", path, "': row ", rows.size() + 1, " has ",
             cells.size(), " cells, the header ", header.size());
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace mg
