// Run directories: the checkpoint state's JSON round trip, atomic checkpoint folders (an error
// or a crash mid-write keeps the previous checkpoint; leftovers are cleaned up), the recovery
// of an interrupted two-rename swap, and metrics.csv (exact numbers, truncation on resume).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/run_dir.h"
#include "models/nn/nn.h"
#include "optim/optim.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

// A pid that belonged to a process that has exited (what a crashed writer leaves in names).
pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TrainingState some_state(int64_t step) {
  return {.step = step, .position = {2, step}, .generators = {{"dropout", {123456789012345ULL, 77}}},
          .elapsed_s = 1.5, .peak_bytes = 4096};
}

}  // namespace

TEST_CASE("TrainingState round-trips through JSON and rejects foreign files", "[apps]") {
  TrainingState s = some_state(9);
  s.generators["data"] = {~0ULL, 5};
  TrainingState t = TrainingState::from_json(s.to_json(), "x");
  CHECK(t.step == 9);
  CHECK(t.position == LoaderPosition{2, 9});
  CHECK(t.generators.at("dropout").seed == 123456789012345ULL);
  CHECK(t.generators.at("dropout").offset == 77);
  CHECK(t.generators.at("data").seed == ~0ULL);  // full 64-bit seeds survive JSON
  CHECK(t.elapsed_s == 1.5);
  CHECK(t.peak_bytes == 4096);
  CHECK_THROWS_WITH(TrainingState::from_json(nlohmann::json{{"step", 1}}, "f.json"),
                    Catch::Contains("'f.json' is not a memgrad checkpoint state"));

  Generator g(5);
  g.advance(10);
  Generator h;
  GeneratorState::of(g).restore(h);
  CHECK(h.seed() == 5);
  CHECK(h.offset() == 10);
}

TEST_CASE("checkpoints are written atomically and a failed or crashed write keeps the previous one", "[apps]") {
  DataTempDir tmp("ckpt");
  RunDir run(tmp.file("run"));
  Generator gen(3);
  Linear net(3, 2, true, {.gen = &gen});
  AdamW opt(net.named_parameters(), 1e-2);
  CHECK_FALSE(run.has_checkpoint());
  CHECK_THROWS_WITH(run.load_checkpoint(net, &opt), Catch::Contains("has no checkpoint"));

  run.save_checkpoint(net, opt, some_state(3));
  REQUIRE(run.has_checkpoint());
  const std::vector<double> saved = net.weight.to_double_vector();

  SECTION("a second save replaces the first") {
    fill_(net.weight, 0.5);
    run.save_checkpoint(net, opt, some_state(6));
    Linear other(3, 2, true, {.gen = &gen});
    CHECK(run.load_checkpoint(other, nullptr).step == 6);
    CHECK(other.weight.to_double_vector() == std::vector<double>(6, 0.5));
    for (const auto& e : fs::directory_iterator(run.path()))  // no temporary or old folder is left
      CHECK(e.path().filename().string().find("checkpoint.") == std::string::npos);
  }
  SECTION("an error in the middle of writing leaves the previous checkpoint and no temporary folder") {
    CHECK_THROWS_WITH(write_folder_atomic(run.checkpoint_dir(),
                                          [&](const std::string& dir) {
                                            test::write_bytes(dir + "/model.safetensors", "half a file");
                                            MG_THROW("disk full");
                                          }),
                      Catch::Contains("disk full"));
    Linear other(3, 2, true, {.gen = &gen});
    CHECK(run.load_checkpoint(other, nullptr).step == 3);
    CHECK(other.weight.to_double_vector() == saved);
    CHECK(std::distance(fs::directory_iterator(run.path()), fs::directory_iterator()) == 1);
  }
  SECTION("a crash mid-write (a dead writer's temporary folder) leaves the previous checkpoint") {
    const std::string crashed = run.file("checkpoint.tmp." + std::to_string(dead_pid()));
    test::write_bytes(crashed + "/model.safetensors", "truncated");
    Linear other(3, 2, true, {.gen = &gen});
    CHECK(run.load_checkpoint(other, &opt).step == 3);
    CHECK(other.weight.to_double_vector() == saved);
    run.save_checkpoint(net, opt, some_state(4));  // the next write removes the leftover
    CHECK_FALSE(fs::exists(crashed));
    CHECK(run.load_checkpoint(other, nullptr).step == 4);
  }
  SECTION("a swap interrupted between its two renames is recovered from checkpoint.old.<pid>") {
    const std::string old = run.file("checkpoint.old." + std::to_string(dead_pid()));
    fs::rename(run.checkpoint_dir(), old);
    REQUIRE(run.has_checkpoint());
    Linear other(3, 2, true, {.gen = &gen});
    CHECK(run.load_checkpoint(other, nullptr).step == 3);
    run.save_checkpoint(net, opt, some_state(5));
    CHECK_FALSE(fs::exists(old));
    CHECK(run.load_checkpoint(other, nullptr).step == 5);
  }
  SECTION("a checkpoint folder without state.json is not a checkpoint") {
    fs::remove(run.checkpoint_dir() + "/state.json");
    CHECK_FALSE(run.has_checkpoint());
  }
}

TEST_CASE("metrics.csv keeps exact numbers and drops rows past the checkpoint on resume", "[apps]") {
  DataTempDir tmp("metrics");
  const std::string path = tmp.file("metrics.csv");
  const std::vector<std::string> cols = {"step", "loss", "val_loss"};
  for (double v : {0.1, 2.7182818284590451, 1e-300, 3.0f * 1.0, double(1.2345678f)})
    CHECK(std::stod(csv_number(v)) == v);
  {
    MetricsWriter w(path, cols);
    for (int64_t s = 0; s < 5; ++s) w.write({csv_number(s), csv_number(1.0 / double(s + 1)), s == 2 ? "0.5" : ""});
  }
  test::write_bytes(path, test::read_bytes(path) + "5,0.1");  // a row cut short by a crash
  {
    MetricsWriter w(path, cols, /*resume_from=*/3);  // the checkpoint was at step 3
    w.write({"3", "9", ""});
  }
  auto rows = read_metrics(path);
  REQUIRE(rows.size() == 4);
  CHECK(rows[1].at("loss") == csv_number(0.5));
  CHECK(rows[2].at("val_loss") == "0.5");
  CHECK(rows[3].at("step") == "3");
  CHECK(rows[3].at("loss") == "9");
  CHECK_THROWS_WITH(MetricsWriter(path, {"step", "loss"}, 1), Catch::Contains("has columns 'step,loss,val_loss'"));
  CHECK_THROWS_WITH(MetricsWriter(path, {"loss"}), Catch::Contains("first column must be 'step'"));
}
