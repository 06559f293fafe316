// `gpt train --ddp` and `vision train --ddp` as library calls under mpirun: the per-step losses in
// rank 0's metrics.csv (and the final loss every rank reports) equal a single-process run of the
// same command within 1e-6 relative, for DDP and ZeRO, with and without --micro-batch; the
// ranks other than 0 leave no run directory behind.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "apps/apps_test_util.h"
#include "apps/bench.h"
#include "apps/gpt_train.h"
#include "apps/vision_train.h"

namespace mg {
namespace {

int world_size() { return launch_info_from_env().world_size; }
int rank() { return launch_info_from_env().rank; }

void check_losses(const std::string& got_dir, const std::string& want_dir, double got_last, double want_last) {
  CHECK(std::abs(got_last - want_last) <= 1e-6 * std::abs(want_last));
  if (rank() != 0) {
    CHECK(!std::filesystem::exists(got_dir));  // rank 0 writes the run
    return;
  }
  const auto got = test::metrics_column(got_dir, "loss"), want = test::metrics_column(want_dir, "loss");
  REQUIRE(got.size() == want.size());
  REQUIRE(got.size() >= 3);
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(std::stod(got[i]) - std::stod(want[i])) <= 1e-6 * std::abs(std::stod(want[i])));
  }
}

}  // namespace

TEST_CASE("gpt train --ddp: the losses of one process on the global batch", "[mpi]") {
  test::DataTempDir tmp("ddp_gpt");
  const std::string data = test::write_tiny_token_file(tmp);
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32, .dropout = 0.0};
  o.data = data;
  o.steps = 4;
  o.batch = 4 * world_size();
  o.lr = 1e-2;
  o.warmup = 1;
  o.eval_every = 4;
  o.eval_windows = 4;
  o.progress = ProgressStyle::none;
  for (int64_t micro : {0, 2}) {
    o.techniques.micro_batch = micro;
    GptTrainOptions one = o;
    one.out = tmp.file("one" + std::to_string(micro));
    const GptTrainResult want = gpt_train(one);
    for (int zero : {0, 1, 2}) {
      INFO("micro-batch " << micro << ", zero " << zero);
      GptTrainOptions d = o;
      d.out = tmp.file("ddp" + std::to_string(micro) + std::to_string(zero));
      d.data_parallel.enabled = true;
      d.data_parallel.zero = zero;
      const GptTrainResult got = gpt_train(d);
      CHECK(got.steps_done == 4);
      check_losses(d.out, one.out, got.last_loss, want.last_loss);
    }
  }
}

TEST_CASE("gpt train --ddp: gpt-mini's losses of one process (DDP, ZeRO-1 with accumulation)", "[mpi]") {
  test::DataTempDir tmp("ddp_gpt_mini");
  GptTrainOptions o;
  o.config = "gpt-mini";
  o.data = test::write_tiny_token_file(tmp);
  o.steps = 3;
  o.batch = 2 * world_size();
  o.warmup = 0;
  o.eval_every = 3;
  o.eval_windows = 2;
  o.progress = ProgressStyle::none;
  o.save_checkpoints = false;
  for (auto [micro, zero] : {std::pair<int64_t, int>{0, 0}, {1, 1}}) {
    INFO("micro-batch " << micro << ", zero " << zero);
    o.techniques.micro_batch = micro;
    GptTrainOptions one = o, d = o;
    one.out = tmp.file("one" + std::to_string(micro));
    d.out = tmp.file("ddp" + std::to_string(micro));
    d.data_parallel.enabled = true;
    d.data_parallel.zero = zero;
    const GptTrainResult want = gpt_train(one), got = gpt_train(d);
    check_losses(d.out, one.out, got.last_loss, want.last_loss);
  }
}

TEST_CASE("vision train --ddp: the losses of one process with batch norm per shard", "[mpi]") {
  test::DataTempDir tmp("ddp_vision");
  const std::string images = test::write_tiny_image_folder(tmp, 24);
  VisionTrainOptions o;
  o.config = MobileNetV2Config{.width_mult = 0.25, .num_classes = 2, .small_input = true, .dropout = 0.0, .input_size = 8};
  o.data = images;
  o.epochs = 1;
  o.batch = 4 * world_size();
  o.lr = 1e-3;
  o.progress = ProgressStyle::none;
  // Each rank normalizes its own 4 rows: the single process does the same with micro-batches of 4.
  VisionTrainOptions one = o;
  one.out = tmp.file("one");
  one.techniques.micro_batch = 4;
  const VisionTrainResult want = vision_train(one);
  VisionTrainOptions d = o;
  d.out = tmp.file("ddp");
  d.data_parallel.enabled = true;
  const VisionTrainResult got = vision_train(d);
  check_losses(d.out, one.out, got.last_loss, want.last_loss);
  CHECK(got.test_accuracy == want.test_accuracy);
}

TEST_CASE("gpt train --ddp: flags that do not fit the ranks are errors", "[mpi]") {
  test::DataTempDir tmp("ddp_flags");
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32, .dropout = 0.0};
  o.data = test::write_tiny_token_file(tmp);
  o.out = tmp.file("run");
  o.progress = ProgressStyle::none;
  o.data_parallel.enabled = true;
  o.batch = 4 * world_size() + 1;
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("does not split evenly over " + std::to_string(world_size()) + " ranks"));
  o.batch = 4 * world_size();
  o.techniques.micro_batch = 5;
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("is larger than each rank's 4 rows"));
  o.techniques.micro_batch = 0;
  o.data_parallel.zero = 1;
  o.optimizer = OptimizerKind::adamw8bit;
  CHECK_THROWS_WITH(gpt_train(o), Catch::Contains("--zero cannot shard adamw8bit"));
}

}  // namespace mg

namespace mg {

TEST_CASE("bench --ddp: every rank's memory and the collectives' time", "[mpi]") {
  test::DataTempDir tmp("ddp_bench");
  BenchOptions o;
  o.gpt = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.0};
  o.data = test::write_tiny_token_file(tmp);
  o.techniques = "none";
  o.steps = 3;
  o.batch = 4 * world_size();
  o.out = tmp.file("bench");
  o.progress = ProgressStyle::none;
  o.data_parallel.enabled = true;
  o.data_parallel.bucket_mb = 0.01;  // several buckets
  const BenchResult plain = run_bench(o);
  o.out = tmp.file("bench_zero2");
  o.data_parallel.zero = 2;
  const BenchResult zero2 = run_bench(o);
  REQUIRE(plain.rows.size() == 1);
  const BenchRow& a = plain.rows[0];
  const BenchRow& z = zero2.rows[0];
  REQUIRE(a.rank_memory.size() == size_t(world_size()));
  REQUIRE(z.rank_memory.size() == size_t(world_size()));
  CHECK(a.comm_ms > 0);
  CHECK(a.exposed_comm_ms <= a.comm_ms * 1.5 + 1.0);
  const size_t optim = size_t(MemoryCategory::optimizer_state);
  for (int r = 0; r < world_size(); ++r) {
    // ZeRO-2 keeps about 1/N of the optimizer state on every rank (slack: padding and rounding).
    const double share = double(z.rank_memory[size_t(r)].category[optim]) / double(a.rank_memory[size_t(r)].category[optim]);
    CHECK(share == Approx(1.0 / world_size()).margin(0.05));
  }
  CHECK(std::abs(a.loss - z.loss) <= 1e-6 * std::abs(a.loss));
  if (rank() == 0) {
    CHECK(std::filesystem::exists(tmp.file("bench/bench.csv")));
    const std::string table = plain.table();
    CHECK(table.find("data-parallel over " + std::to_string(world_size()) + " ranks") != std::string::npos);
    CHECK(table.find("% hidden behind backward") != std::string::npos);
  }
}

}  // namespace mg

namespace mg {

TEST_CASE("gpt train --ddp --zero 2: an interrupted and resumed run equals the uninterrupted one, the checkpoint "
          "is a whole optimizer state", "[mpi]") {
  test::DataTempDir tmp("ddp_resume");
  // Every rank resumes from rank 0's run directory.
  const std::string root = ProcessGroup::world()->broadcast_string(tmp.dir.string(), 0);
  GptTrainOptions o;
  o.model = GPTConfig{.vocab_size = 256, .context = 16, .n_layer = 1, .n_head = 2, .d_model = 32, .dropout = 0.0};
  o.data = test::write_tiny_token_file(tmp);
  o.steps = 6;
  o.batch = 2 * world_size();
  o.lr = 1e-2;
  o.warmup = 1;
  o.eval_every = 6;
  o.eval_windows = 4;
  o.checkpoint_every = 3;
  o.progress = ProgressStyle::none;
  o.data_parallel.enabled = true;
  o.data_parallel.zero = 2;
  GptTrainOptions full = o, split = o;
  full.out = tmp.file("full");
  split.out = tmp.file("split");
  split.stop_after = 4;  // killed after step 4: the checkpoint is step 3's
  const GptTrainResult want = gpt_train(full);
  gpt_train(split);
  GptTrainOptions resume;
  resume.resume = root + "/split";
  resume.progress = ProgressStyle::none;
  resume.data_parallel = o.data_parallel;
  const GptTrainResult got = gpt_train(resume);
  CHECK(got.first_step == 3);
  CHECK(got.last_loss == want.last_loss);
  if (rank() == 0) {
    CHECK(test::metrics_column(tmp.file("split"), "loss") == test::metrics_column(tmp.file("full"), "loss"));
    // The checkpoint's optimizer state is the whole model's: a plain optimizer loads it.
    GPT model(*o.model);
    auto opt = make_optimizer(o, model);
    opt->load(tmp.file("full/checkpoint/optimizer.safetensors"));
    CHECK(opt->state("wte.weight") != nullptr);
    CHECK(opt->state("wte.weight")->step == 6);
  }
}

}  // namespace mg
