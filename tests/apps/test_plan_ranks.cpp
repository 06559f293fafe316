// memgrad plan's data-parallel rows (ddp=N, zero1=N, zero2=N): every rank simulated on meta (the
// exactness against real ranks is tests/mpi/test_plan_ranks.cpp), ZeRO's shards in the rows, each
// rank's collectives in the estimate, "fits" when every rank fits, and the combinations the
// training commands refuse refused here.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "apps/plan.h"
#include "core/error.h"
#include "plan_test_util.h"

using namespace mg;

using mg::test::tiny_gpt;
using mg::test::use_test_cache;

namespace {

int64_t cat(const StepMemory& m, MemoryCategory c) { return m.category[size_t(c)]; }

}  // namespace

TEST_CASE("plan ranks: every rank simulated with ZeRO sharding state and gradients and fits when every rank does", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.techniques = "none,ddp=2,zero1=2,zero2=2,ckpt+zero2=2,accum2+zero2=2";
  o.bucket_mb = 1.0 / 64;  // 16 KiB: several buckets, so ZeRO-2 holds one at a time
  o.verify = true;
  const Plan p = make_plan(o);
  REQUIRE(p.rows.size() == 6);
  const PlanRow &none = p.rows[0], &ddp = p.rows[1], &z1 = p.rows[2], &z2 = p.rows[3];
  CHECK(none.ranks.empty());
  for (size_t i = 1; i < p.rows.size(); ++i) {
    const PlanRow& r = p.rows[i];
    INFO(r.combination.name);
    REQUIRE(r.ranks.size() == 2);
    CHECK(r.ranks[0].rank == 0);
    CHECK(r.ranks[1].rank == 1);
    // The row is its fullest rank.
    CHECK(r.memory.peak == std::max(r.ranks[0].memory.peak, r.ranks[1].memory.peak));
    CHECK(r.comm_ms > 0);
    CHECK(r.estimated_ms == Approx(p.calibration.estimate_ms(r.flops) + r.comm_ms));
    // --verify cannot launch ranks: no measurement, not marked out of memory.
    CHECK(!r.measured);
    CHECK(r.measured_fits);
  }
  REQUIRE(none.measured);
  // Each rank runs half the batch: less activation than the whole batch.
  CHECK(cat(ddp.memory, MemoryCategory::activation) < cat(none.memory, MemoryCategory::activation));
  // DDP keeps the whole state; ZeRO-1 half of it per rank (the two shards make the whole, within
  // the allocator's blocks); ZeRO-2 also shards the gradients.
  const int64_t state = cat(none.memory, MemoryCategory::optimizer_state);
  CHECK(cat(ddp.memory, MemoryCategory::optimizer_state) == state);
  const int64_t shards = cat(z1.ranks[0].memory, MemoryCategory::optimizer_state) +
                         cat(z1.ranks[1].memory, MemoryCategory::optimizer_state);
  CHECK(std::abs(double(shards - state)) <= 0.05 * double(state));
  CHECK(cat(z2.memory, MemoryCategory::gradient) < cat(z1.memory, MemoryCategory::gradient));
  // What travels: DDP all-reduces the gradients; ZeRO-1 also all-gathers the parameters; ZeRO-2
  // reduce-scatters instead of all-reducing.
  const int64_t param_bytes = 4 * p.num_parameters;
  CHECK(ddp.traffic.all_reduce >= param_bytes);
  CHECK(ddp.traffic.all_gather == 0);
  CHECK(z1.traffic.all_gather >= param_bytes);
  CHECK(z2.traffic.reduce_scatter >= param_bytes);
  CHECK(z2.traffic.all_reduce < param_bytes);  // only the scalars
  // A budget between ZeRO-2's fullest rank and DDP's: ZeRO-2 fits, DDP does not.
  REQUIRE(z2.memory.peak < ddp.memory.peak);
  PlanOptions b = o;
  b.verify = false;
  b.techniques = "ddp=2,zero2=2";
  b.memory_limit = std::to_string((z2.memory.peak + ddp.memory.peak) / 2);
  const Plan budgeted = make_plan(b);
  CHECK_FALSE(budgeted.rows[0].fits);
  CHECK(budgeted.rows[1].fits);
  CHECK(budgeted.recommended == 1);
  // JSON: each rank's peaks and the collectives.
  const nlohmann::json j = p.to_json();
  CHECK(j[3]["ranks"].size() == 2);
  CHECK(j[3]["collective_bytes"]["reduce_scatter"].get<int64_t>() == z2.traffic.reduce_scatter);
  CHECK(j[0].count("ranks") == 0);
  // The table names each rank and says how to measure them.
  const std::string table = p.table();
  CHECK(table.find("  rank 1 ") != std::string::npos);
  CHECK(table.find("mpirun -np N memgrad bench --ddp") != std::string::npos);
}

TEST_CASE("plan ranks: --ranks adds data-parallel defaults and what training refuses is refused", "[plan][apps]") {
  use_test_cache();
  PlanOptions o;
  o.workload = tiny_gpt();
  o.ranks = 2;
  const Plan p = make_plan(o);
  int with_ranks = 0;
  for (const PlanRow& r : p.rows) with_ranks += r.combination.ranks == 2;
  CHECK(with_ranks == 5);
  CHECK(rank_candidates(4) == "ddp=4,zero1=4,zero2=4,ckpt+zero2=4,bf16+zero2=4");
  o.techniques = "none";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("with --techniques name them there"));
  o.ranks = 0;
  o.techniques = "zero2=3";  // batch 4
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("does not divide"));
  o.techniques = "bf16pure+ddp=2";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("bf16pure stores them in bf16"));
  o.techniques = "adam8bit+zero1=2";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("ZeRO cannot shard adam8bit"));
  o.techniques = "zero2=0";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("needs a whole number of ranks"));
  o.techniques = "zero3=2";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("unknown technique 'zero3=2'"));
  o.techniques = "ddp=2+zero1=2";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("names data parallelism twice"));
  o.techniques = "accum4+ddp=2";  // micro-batch 1 of a rank's 2 rows: fine
  CHECK_NOTHROW(make_plan(o));
  o.techniques = "split=balanced+ddp=2";
  o.devices = {Device("cpu:0"), Device("cpu:1")};
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("each data-parallel rank trains a whole replica"));
  o.devices = {};
  o.workload->batch = 128;
  o.techniques = "ddp=128";
  CHECK_THROWS_WITH(make_plan(o), Catch::Contains("at most 64 ranks"));
}

TEST_CASE("plan ranks: collectives at the rates measured on real ranks when there are some, else the stand-in", "[plan][apps]") {
  use_test_cache();
  const Calibration calibration = Calibration::of_this_machine();
  // A cache of its own: no rates measured by another test's job.
  const auto dir = std::filesystem::temp_directory_path() / ("memgrad-test-rates-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("MG_CACHE_DIR", dir.c_str(), 1);
  // The ring: an all-reduce sends 2 (N - 1) / N of its bytes, a reduce-scatter or all-gather
  // (N - 1) / N, a broadcast all of them.
  const ProcessGroup::Traffic sent = ring_bytes_sent({.all_reduce = 400, .reduce_scatter = 400, .all_gather = 800, .broadcast = 10}, 4);
  CHECK(sent.all_reduce == 600);
  CHECK(sent.reduce_scatter == 300);
  CHECK(sent.all_gather == 600);
  CHECK(sent.broadcast == 10);
  CHECK(ring_bytes_sent({.all_reduce = 400}, 1).all_reduce == 0);

  PlanOptions o;
  o.workload = tiny_gpt();
  o.techniques = "ddp=2,zero1=2,zero1=4";
  o.calibration = calibration;
  const Plan stand_in = make_plan(o);
  for (const PlanRow& r : stand_in.rows) CHECK(r.comm_rates.empty());
  CHECK(stand_in.table().find("(stand-in: the copy bandwidth)") != std::string::npos);

  CollectiveRates rates{.ranks = 2, .bucket_mb = o.bucket_mb, .all_reduce_gbps = 0.5, .reduce_scatter_gbps = 0.25,
                        .all_gather_gbps = 0.125, .broadcast_gbps = 1.0};
  o.collectives = rates;
  const Plan measured = make_plan(o);
  for (size_t i = 0; i < 2; ++i) {
    const PlanRow& r = measured.rows[i];
    INFO(r.combination.name);
    const ProcessGroup::Traffic s = ring_bytes_sent(r.traffic, 2);
    CHECK(r.comm_ms == Approx(1e3 * (s.all_reduce / 0.5e9 + s.reduce_scatter / 0.25e9 + s.all_gather / 0.125e9 +
                                     s.broadcast / 1e9)));
    CHECK(r.comm_rates == rates.str());
    CHECK(r.estimated_ms == Approx(measured.calibration.estimate_ms(r.flops) + r.comm_ms));
  }
  CHECK(measured.rows[2].comm_rates.empty());  // 4 ranks: not what was measured
  CHECK(measured.table().find("(measured: all-reduce 0.50, reduce-scatter 0.25, all-gather 0.12") != std::string::npos);
  CHECK(measured.to_json()[0]["collective_rates_measured"] == true);

  // Saved, the rates serve a later plan in one process; another bucket size does not read them.
  rates.save();
  REQUIRE_FALSE(rates.path.empty());
  o.collectives.reset();
  const Plan later = make_plan(o);
  CHECK(later.rows[0].comm_rates == rates.str());
  CHECK(later.rows[0].comm_ms == Approx(measured.rows[0].comm_ms));
  CHECK_FALSE(CollectiveRates::cached(2, o.bucket_mb * 2).has_value());
  {
    std::ofstream(rates.path) << "{ not json";
  }
  CHECK_FALSE(CollectiveRates::cached(2, o.bucket_mb).has_value());  // a corrupt cache: the stand-in
  std::filesystem::remove_all(dir);
  use_test_cache();
}
