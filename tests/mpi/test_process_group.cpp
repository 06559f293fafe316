// The process group's collectives under mpirun (-np 2 and -np 3, registered in tests/CMakeLists.txt):
// results against values every rank can compute itself, and the errors of diverged ranks. The
// early-exit case runs as its own mpirun (its pending collective would poison the rest).
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "ops/ops.h"
#include "parallel/process_group.h"

namespace mg {
namespace {

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> g = ProcessGroup::world(std::chrono::seconds(30));
  return g;
}

// Rank r's tensor: element i is (r + 1) * (i + 1).
Tensor rank_values(int64_t n, int r, DType dt = DType::f32) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double((r + 1) * (i + 1));
  return contiguous(cast(from_vector(v, {n}, {.dtype = DType::f64}), dt));
}

}  // namespace

TEST_CASE("process group: rank and world size from mpirun", "[mpi]") {
  auto g = world();
  REQUIRE(g->world_size() >= 2);
  CHECK(g->info().source == "OMPI_COMM_WORLD_*");
  CHECK(g->rank() < g->world_size());
  CHECK(g->local_rank() == g->rank());  // one machine
}

TEST_CASE("process group: all-reduce, reduce-scatter, all-gather, broadcast", "[mpi]") {
  auto g = world();
  const int N = g->world_size(), r = g->rank();
  const int64_t tri = int64_t(N) * (N + 1) / 2;  // sum over ranks of (r + 1)
  for (DType dt : {DType::f32, DType::f64, DType::i64}) {
    INFO("dtype " << dt);
    Tensor t = rank_values(5, r, dt);
    g->all_reduce(t, ReduceOp::sum);
    for (int64_t i = 0; i < 5; ++i) CHECK(t.to_double_vector()[size_t(i)] == double(tri * (i + 1)));
  }
  Tensor m = rank_values(4, r);
  g->all_reduce(m, ReduceOp::mean);
  CHECK(m.to_double_vector()[3] == Approx(double(tri * 4) / N));

  Tensor in = rank_values(3 * N, r), out = empty({3});
  g->reduce_scatter(in, out);
  for (int64_t i = 0; i < 3; ++i) CHECK(out.to_double_vector()[size_t(i)] == double(tri * (3 * r + i + 1)));

  Tensor all = empty({2 * int64_t(N)});
  g->all_gather(rank_values(2, r), all);
  for (int q = 0; q < N; ++q) {
    CHECK(all.to_double_vector()[size_t(2 * q)] == double(q + 1));
    CHECK(all.to_double_vector()[size_t(2 * q + 1)] == double(2 * (q + 1)));
  }
  // In place: this rank's block of the output is the input.
  Tensor flat = zeros({2 * int64_t(N)});
  copy_(narrow(flat, 0, 2 * r, 2), rank_values(2, r));
  g->all_gather(narrow(flat, 0, 2 * r, 2), flat);
  CHECK(flat.to_double_vector() == all.to_double_vector());

  Tensor b = rank_values(4, r, DType::i32);
  g->broadcast(b, N - 1);
  CHECK(b.to_double_vector() == rank_values(4, N - 1, DType::i32).to_double_vector());
  CHECK(g->broadcast_string(r == 0 ? "from rank 0" : "ignored") == "from rank 0");
  CHECK(g->all_reduce_scalar(1.5) == 1.5 * N);
  g->barrier();
}

TEST_CASE("process group: ranks that call different collectives get an error listing each rank's call", "[mpi]") {
  auto g = world();
  const int r = g->world_size() - 1 == g->rank() ? 1 : 0;  // the last rank passes one more element
  Tensor t = zeros({4 + r});
  try {
    g->all_reduce(t);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("the ranks called different collectives") != std::string::npos);
    CHECK(msg.find("of 4 f32 elements") != std::string::npos);
    CHECK(msg.find("of 5 f32 elements") != std::string::npos);
    CHECK(msg.find("rank " + std::to_string(g->world_size() - 1) + ": all_reduce") != std::string::npos);
  }
  g->barrier();  // still in step afterwards
  Tensor ok = ones({2});
  g->all_reduce(ok);
  CHECK(ok.to_double_vector()[0] == double(g->world_size()));
}

TEST_CASE("process group: a rank that exits early makes the others fail within the timeout", "[mpi-early-exit]") {
  auto g = world();
  g->barrier();
  if (g->rank() == g->world_size() - 1) return;  // this rank is done: it finalizes and exits
  g->set_timeout(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  Tensor t = ones({8});
  try {
    g->all_reduce(t);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("all_reduce #") != std::string::npos);
    CHECK(msg.find("of 8 f32 elements on rank " + std::to_string(g->rank())) != std::string::npos);
    CHECK(msg.find("did not join within 1.5 s") != std::string::npos);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s >= 1.4);
  CHECK(s < 5.0);
}

}  // namespace mg
