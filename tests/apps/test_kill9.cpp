// kill -9 at random moments of `gpt train` (a tiny GPT with dropout, a checkpoint after every
// step): a child process (this test binary re-executed on the hidden case [kill9_child]) trains,
// the parent SIGKILLs it after a random delay, then resumes the run in a new child, at least 20
// times, some of them while a checkpoint was being written (its temporary folder was there).
// Every resume must work, and the final metrics.csv must hold the uninterrupted run's losses.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "apps/apps_test_util.h"
#include "apps/gpt_train.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

namespace {

GptTrainOptions kill9_options(const std::string& data, const std::string& out) {
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32, .dropout = 0.1};
  o.data = data;
  o.out = out;
  o.steps = 24;
  o.batch = 4;
  o.lr = 1e-2;
  o.warmup = 2;
  o.eval_every = 8;
  o.eval_windows = 4;
  o.checkpoint_every = 1;
  o.progress = ProgressStyle::none;
  return o;
}

// Starts this binary on the hidden child case; MG_KILL9_DATA / MG_KILL9_OUT say what to train.
pid_t start_child(const std::string& data, const std::string& out) {
  std::fflush(stdout);  // or the child would print what this process has buffered
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("MG_KILL9_DATA", data.c_str(), 1);
    ::setenv("MG_KILL9_OUT", out.c_str(), 1);
    std::freopen((out + ".log").c_str(), "w", stdout);  // the last child's report, shown on failure
    ::execl("/proc/self/exe", "mg_tests", "[kill9_child]", (char*)nullptr);
    ::_exit(127);
  }
  return pid;
}

// The child `pid` is writing a checkpoint: its temporary folder is there (Note [Checkpoint swap]).
bool checkpoint_write_in_progress(const std::string& run, pid_t pid) {
  return fs::exists(run + "/checkpoint.tmp." + std::to_string(pid));
}

}  // namespace

// The child: a fresh run, or the resumption of one that has a checkpoint.
TEST_CASE("kill -9 child: train or resume", "[.][kill9_child]") {
  const char* data = std::getenv("MG_KILL9_DATA");
  const char* out = std::getenv("MG_KILL9_OUT");
  REQUIRE(data != nullptr);
  REQUIRE(out != nullptr);
  if (RunDir(out).has_checkpoint()) {
    GptTrainOptions resume;
    resume.resume = out;
    resume.progress = ProgressStyle::none;
    gpt_train(resume);
  } else {
    fs::remove_all(out);  // killed before its first checkpoint: start again
    gpt_train(kill9_options(data, out));
  }
}

TEST_CASE("kill -9 at random moments of gpt train: every resume works and the losses equal an uninterrupted run's",
          "[apps][faults][slow]") {
  DataTempDir tmp("kill9");
  const std::string data = write_tiny_token_file(tmp);
  gpt_train(kill9_options(data, tmp.file("full")));
  const std::vector<std::string> want = metrics_column(tmp.file("full"), "loss");
  REQUIRE(want.size() == 24);

  // How long an uninterrupted child takes (start-up included), to spread the kills over it.
  const std::string run = tmp.file("killed");
  auto t0 = std::chrono::steady_clock::now();
  pid_t probe = start_child(data, tmp.file("probe"));
  int status = 0;
  ::waitpid(probe, &status, 0);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  const double child_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  Generator g(2024);
  int kills = 0, during_checkpoint = 0, finished_early = 0, resumes = 0;
  for (int i = 0; kills < 20 && i < 200; ++i) {
    resumes += RunDir(run).has_checkpoint();
    pid_t pid = start_child(data, run);
    const double delay_ms = g.uniform_at(uint64_t(i)) * child_ms;
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(delay_ms * 1000)));
    const bool in_checkpoint = checkpoint_write_in_progress(run, pid);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++kills;
      during_checkpoint += in_checkpoint;
    } else {
      INFO("child exit status " << WEXITSTATUS(status) << ", output:\n" << read_bytes(run + ".log"));
      REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));  // a resume that fails is a failure
      ++finished_early;
      if (kills < 20) fs::remove_all(run);  // it finished before the kill: go again from scratch
    }
  }
  // The last resume runs to the end.
  resumes += RunDir(run).has_checkpoint();
  pid_t last = start_child(data, run);
  ::waitpid(last, &status, 0);
  INFO("the last child's output:\n" << read_bytes(run + ".log"));
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  std::printf("kill -9: %d kills (%d while a checkpoint folder was being written), %d resumes, %d runs finished "
              "before their kill; final losses equal the uninterrupted run's: %s\n",
              kills, during_checkpoint, resumes, finished_early,
              metrics_column(run, "loss") == want ? "yes" : "NO");
  CHECK(kills >= 20);
  CHECK(metrics_column(run, "loss") == want);
  CHECK(metrics_column(run, "val_loss") == metrics_column(tmp.file("full"), "val_loss"));
}
