// The measured collective rates of a data-parallel job (see collective_rates.h).
#include "apps/collective_rates.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cost_model.h"
#include "core/error.h"
#include "ops/ops.h"

namespace mg {

namespace fs = std::filesystem;

namespace {

constexpr int kCollectiveRatesVersion = 1;

std::string cache_path(int ranks) {
  return (fs::path(memgrad_cache_dir()) / ("collectives-" + std::to_string(ranks) + "ranks.json")).string();
}

// The median of `reps` timings (after a warm-up) of `op` on every rank, each timing the mean
// over the ranks, in seconds.
template <typename Op>
double timed(ProcessGroup& g, int reps, Op op) {
  op();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    g.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    op();
    const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.push_back(g.all_reduce_scalar(mine, ReduceOp::mean));
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

ProcessGroup::Traffic ring_bytes_sent(const ProcessGroup::Traffic& t, int ranks) {
  if (ranks <= 1) return {};
  auto share = [ranks](int64_t bytes, int64_t times) { return bytes * times * (ranks - 1) / ranks; };
  return {.all_reduce = share(t.all_reduce, 2), .reduce_scatter = share(t.reduce_scatter, 1),
          .all_gather = share(t.all_gather, 1), .broadcast = t.broadcast};
}

CollectiveRates CollectiveRates::measure(ProcessGroup& g, double bucket_mb, int reps) {
  const int N = g.world_size();
  MG_CHECK(!g.is_simulated() && N >= 2, "collective rates: need a real group of 2+ ranks (mpirun -np N), got ",
           g.is_simulated() ? "a simulated one" : std::to_string(N) + " rank");
  MG_CHECK(bucket_mb > 0, "collective rates: the bucket must be positive, got ", bucket_mb, " MiB");
  MG_CHECK(reps >= 1, "collective rates: need 1+ repetitions, got ", reps);
  // One bucket of f32 gradients, a multiple of the ranks so that it shards evenly.
  const int64_t n = std::max<int64_t>(N, int64_t(bucket_mb * 1024 * 1024 / 4) / N * N);
  const Tensor bucket = zeros({n}), shard = zeros({n / N});
  const int64_t bytes = n * 4;
  CollectiveRates r{.ranks = N, .bucket_mb = bucket_mb};
  auto rate = [&](int64_t sent, double seconds) { return double(sent) / seconds / 1e9; };
  const ProcessGroup::Traffic one{.all_reduce = bytes, .reduce_scatter = bytes, .all_gather = bytes, .broadcast = bytes};
  const ProcessGroup::Traffic sent = ring_bytes_sent(one, N);
  r.all_reduce_gbps = rate(sent.all_reduce, timed(g, reps, [&] { g.all_reduce(bucket); }));
  r.reduce_scatter_gbps = rate(sent.reduce_scatter, timed(g, reps, [&] { g.reduce_scatter(bucket, shard); }));
  r.all_gather_gbps = rate(sent.all_gather, timed(g, reps, [&] { g.all_gather(shard, bucket); }));
  r.broadcast_gbps = rate(sent.broadcast, timed(g, reps, [&] { g.broadcast(bucket); }));
  return r;
}

std::optional<CollectiveRates> CollectiveRates::cached(int ranks, double bucket_mb) {
  try {  // missing, unreadable, another CPU, bucket or version: none
    std::ifstream f(cache_path(ranks));
    if (!f) return std::nullopt;
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.at("version").get<int>() != kCollectiveRatesVersion || j.at("cpu").get<std::string>() != cpu_model_name() ||
        j.at("ranks").get<int>() != ranks || j.at("bucket_mb").get<double>() != bucket_mb)
      return std::nullopt;
    CollectiveRates r{.ranks = ranks, .bucket_mb = bucket_mb};
    r.all_reduce_gbps = j.at("all_reduce_gbps").get<double>();
    r.reduce_scatter_gbps = j.at("reduce_scatter_gbps").get<double>();
    r.all_gather_gbps = j.at("all_gather_gbps").get<double>();
    r.broadcast_gbps = j.at("broadcast_gbps").get<double>();
    for (double v : {r.all_reduce_gbps, r.reduce_scatter_gbps, r.all_gather_gbps, r.broadcast_gbps})
      if (!(v > 0)) return std::nullopt;
    r.path = cache_path(ranks);
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void CollectiveRates::save() {
  const std::string target = cache_path(ranks);
  const nlohmann::json j{{"version", kCollectiveRatesVersion}, {"cpu", cpu_model_name()}, {"ranks", ranks},
                         {"bucket_mb", bucket_mb}, {"all_reduce_gbps", all_reduce_gbps},
                         {"reduce_scatter_gbps", reduce_scatter_gbps}, {"all_gather_gbps", all_gather_gbps},
                         {"broadcast_gbps", broadcast_gbps}};
  std::error_code ec;
  fs::create_directories(fs::path(target).parent_path(), ec);
  path.clear();
  {
    std::ofstream out(target + ".tmp");
    if (ec || !out) return;
    out << j.dump(2) << "\n";
  }
  fs::rename(target + ".tmp", target, ec);
  if (!ec) path = target;
}

double CollectiveRates::ms(const ProcessGroup::Traffic& t) const {
  const ProcessGroup::Traffic s = ring_bytes_sent(t, ranks);
  auto at = [](int64_t bytes, double gbps) { return bytes > 0 ? 1e3 * double(bytes) / (gbps * 1e9) : 0.0; };
  return at(s.all_reduce, all_reduce_gbps) + at(s.reduce_scatter, reduce_scatter_gbps) +
         at(s.all_gather, all_gather_gbps) + at(s.broadcast, broadcast_gbps);
}

std::string CollectiveRates::str() const {
  char line[256];
  std::snprintf(line, sizeof line,
                "all-reduce %.2f, reduce-scatter %.2f, all-gather %.2f, broadcast %.2f GB/s at %d ranks, %g MiB buckets",
                all_reduce_gbps, reduce_scatter_gbps, all_gather_gbps, broadcast_gbps, ranks, bucket_mb);
  return line;
}

}  // namespace mg
