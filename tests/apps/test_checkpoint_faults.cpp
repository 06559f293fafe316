// Checkpoint writes that fail: an I/O error injected at every single write of a save (each
// write()/pwrite()/fsync() of model.safetensors, optimizer.safetensors and state.json), and a
// full disk (a file-size limit). Each failure must leave the previous checkpoint loadable and
// unchanged, no temporary folder behind, and an error that says the previous one is intact.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/run_dir.h"
#include "core/fault_injection.h"
#include "models/nn/nn.h"
#include "optim/optim.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

TrainingState at_step(int64_t step) {
  TrainingState s;
  s.step = step;
  return s;
}

int64_t entries_in(const std::string& dir) {
  return std::distance(fs::directory_iterator(dir), fs::directory_iterator());
}

}  // namespace

TEST_CASE("checkpoint faults: an I/O error at any write keeps the previous checkpoint and says so",
          "[apps][faults]") {
  DataTempDir tmp("ckfault");
  RunDir run(tmp.file("run"));
  Generator gen(3);
  Linear net(3, 2, true, {.gen = &gen});
  AdamW opt(net.named_parameters(), 1e-2);

  SECTION("the first checkpoint fails: none is left half there") {
    FaultGuard fault(FaultSite::file_write, 1);
    CHECK_THROWS_WITH(run.save_checkpoint(net, opt, at_step(1)),
                      Catch::Contains("checkpoint of step 1 not written") &&
                          Catch::Contains("there is no previous checkpoint"));
    CHECK_FALSE(run.has_checkpoint());
    CHECK_FALSE(fs::exists(run.checkpoint_dir()));
  }
  SECTION("every write of a later checkpoint") {
    run.save_checkpoint(net, opt, at_step(3));
    const std::vector<double> saved = net.weight.to_double_vector();
    const std::string model_bytes = read_bytes(run.checkpoint_dir() + "/model.safetensors");
    fill_(net.weight, 0.5);

    int64_t writes = 0;
    {
      FaultGuard count(FaultSite::file_write, INT64_MAX);  // counts, never fails
      run.save_checkpoint(net, opt, at_step(4));
      writes = fault_events(FaultSite::file_write);
    }
    REQUIRE(writes >= 9);  // 2 safetensors files x (header, data, header rewrite, fsync) + state.json
    run.save_checkpoint(net, opt, at_step(3));  // back to step 3, with the 0.5 weights
    const std::string model_half = read_bytes(run.checkpoint_dir() + "/model.safetensors");
    CHECK(model_half != model_bytes);

    for (int64_t n = 1; n <= writes; ++n) {
      INFO("failing write " << n << " of " << writes);
      fill_(net.weight, 0.25);
      {
        FaultGuard fault(FaultSite::file_write, n);
        CHECK_THROWS_WITH(run.save_checkpoint(net, opt, at_step(6)),
                          Catch::Contains("checkpoint of step 6 not written") &&
                              Catch::Contains("Input/output error") &&
                              Catch::Contains("the previous checkpoint (step 3, " + run.checkpoint_dir() +
                                              ") is intact"));
      }
      CHECK(read_bytes(run.checkpoint_dir() + "/model.safetensors") == model_half);
      Linear other(3, 2, true, {.gen = &gen});
      AdamW other_opt(other.named_parameters(), 1e-2);
      CHECK(run.load_checkpoint(other, &other_opt).step == 3);
      CHECK(other.weight.to_double_vector() == std::vector<double>(6, 0.5));
      CHECK(entries_in(run.path()) == 1);  // checkpoint/ only: no temporary folder left
    }
    std::printf("checkpoint faults: an I/O error at each of the %lld writes of a checkpoint save: the previous "
                "checkpoint intact every time\n", (long long)writes);
    run.save_checkpoint(net, opt, at_step(6));  // with the fault gone the save works
    CHECK(run.read_checkpoint_state().step == 6);
  }
}

TEST_CASE("checkpoint faults: a full disk keeps the previous checkpoint and says so", "[apps][faults]") {
  DataTempDir tmp("ckfull");
  RunDir run(tmp.file("run"));
  Generator gen(3);
  Linear small(3, 2, true, {.gen = &gen});
  AdamW small_opt(small.named_parameters(), 1e-2);
  run.save_checkpoint(small, small_opt, at_step(2));
  Linear big(256, 64, true, {.gen = &gen});  // 64 KiB of weights: past the 16 KiB limit below
  AdamW big_opt(big.named_parameters(), 1e-2);

  // A file-size limit makes write() fail with EFBIG, as a full disk would (ENOSPC).
  struct rlimit saved;
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = saved;
  limit.rlim_cur = 16384;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  std::string msg;
  try {
    run.save_checkpoint(big, big_opt, at_step(5));
  } catch (const Error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  INFO(msg);
  CHECK(msg.find("checkpoint of step 5 not written") != std::string::npos);
  CHECK(msg.find("model.safetensors") != std::string::npos);
  CHECK(msg.find("the previous checkpoint (step 2") != std::string::npos);
  CHECK(run.read_checkpoint_state().step == 2);
  Linear other(3, 2, true, {.gen = &gen});
  run.load_weights(other);
  CHECK(other.weight.to_double_vector() == small.weight.to_double_vector());
  CHECK(entries_in(run.path()) == 1);
}
