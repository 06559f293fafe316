// The collective rates the planner measures on a real job (apps/collective_rates.h): positive,
// finite, the same on every rank, and what the plan of a data-parallel row of this many ranks then
// charges its collectives at.
#include <catch2/catch.hpp>

#include <cmath>

#include "apps/collective_rates.h"
#include "apps/plan.h"

namespace mg {

TEST_CASE("collective rates: measured on the job's ranks, the same on every rank, used by its plan", "[mpi]") {
  static std::shared_ptr<ProcessGroup> g = ProcessGroup::world(std::chrono::seconds(30));
  const double bucket_mb = 0.25;
  const CollectiveRates r = CollectiveRates::measure(*g, bucket_mb, 3);
  CHECK(r.ranks == g->world_size());
  for (double v : {r.all_reduce_gbps, r.reduce_scatter_gbps, r.all_gather_gbps, r.broadcast_gbps}) {
    CHECK(std::isfinite(v));
    CHECK(v > 0);
  }
  CHECK(g->broadcast_string(r.str()) == r.str());  // every rank holds rank 0's rates
  CHECK_THROWS_WITH(CollectiveRates::measure(*ProcessGroup::simulated(0, 2), bucket_mb),
                    Catch::Contains("need a real group"));

  if (g->rank() != 0) return;
  PlanOptions o;
  o.workload = PlanWorkload{};
  o.workload->name = "tiny-gpt";
  o.workload->gpt = GPTConfig{.vocab_size = 64, .context = 16, .n_layer = 2, .n_head = 2, .d_model = 32, .dropout = 0.0};
  o.workload->batch = 2 * g->world_size();
  o.techniques = "ddp=" + std::to_string(g->world_size());
  o.bucket_mb = bucket_mb;
  o.collectives = r;
  const Plan p = make_plan(o);
  REQUIRE(p.rows.size() == 1);
  CHECK(p.rows[0].comm_rates == r.str());
  CHECK(p.rows[0].comm_ms == Approx(r.ms(p.rows[0].traffic)));
}

}  // namespace mg
