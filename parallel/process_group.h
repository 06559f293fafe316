// ProcessGroup: the ranks of a data-parallel job and the collectives between them. Rank, world
// size and local rank come from the launcher (mpirun's OMPI_COMM_WORLD_*, or RANK / WORLD_SIZE /
// LOCAL_RANK); host tensors travel over MPI, cuda:N tensors over NCCL (parallel/nccl_comm.h, CUDA
// builds only). Note [Collective timeouts]: every collective is non-blocking MPI polled against a
// deadline, and first agrees on what it is (kind, element count, dtype, sequence number), so a
// dead or diverged rank is an error on the others that names the collective and the rank, never a hang.
// A simulated group (Note [Simulated ranks]) stands for one rank of N in a single process, on meta
// tensors: what the planner runs to measure a rank's memory and traffic without launching N.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mg {

// Where this process stands in the job, as the launcher says.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // rank on this machine: picks cuda:LOCAL_RANK
  std::string source;       // "OMPI_COMM_WORLD_*", "RANK/WORLD_SIZE", or "none (one process)"
};
// Reads the environment; an error names a variable that is set but not a valid number.
LaunchInfo launch_info_from_env();

// Whether this build has MPI (MG_WITH_MPI); without it only world size 1 exists.
bool mpi_is_built();

enum class ReduceOp { sum, mean };

class NcclComm;

class ProcessGroup {
 public:
  // The job's group: initializes MPI once per process (MPI_THREAD_MULTIPLE requested, SERIALIZED
  // needed: collectives are serialized here, any thread may issue them). World size 1 works
  // without MPI. timeout: how long a collective may wait for the other ranks.
  static std::shared_ptr<ProcessGroup> world(std::chrono::milliseconds timeout = default_timeout());
  // MEMGRAD_DDP_TIMEOUT_S (seconds) or 300 s.
  static std::chrono::milliseconds default_timeout();
  // Note [Simulated ranks]: rank `rank` of `world_size` in this one process, for a step on the
  // meta device (shapes and bytes, no data): each collective checks its arguments as the real one
  // does, requires meta tensors, counts its bytes (traffic()) and returns, since there is nothing
  // to move. Scalars come back as if every rank held this one's value (a sum is world_size x v), and
  // broadcast strings as sent. No MPI is needed or touched.
  static std::shared_ptr<ProcessGroup> simulated(int rank, int world_size);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  const LaunchInfo& info() const { return info_; }
  bool is_simulated() const { return simulated_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // In place on every rank: t = sum (or mean) over ranks. t: contiguous, same shape and dtype
  // (f32, f64, i32, i64) everywhere.
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // in: (world * n) elements on every rank -> out: (n) = rank r's block of the reduction.
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  // in: (n) from every rank -> out: (world * n), rank r's block at r * n.
  void all_gather(const Tensor& in, const Tensor& out);
  // t of `root` copied into t everywhere (any dtype).
  void broadcast(const Tensor& t, int root = 0);
  void barrier();
  // Host scalars and strings (counts, losses, model descriptions).
  double all_reduce_scalar(double v, ReduceOp op = ReduceOp::sum);
  std::string broadcast_string(const std::string& s, int root = 0);

  // Attaches NCCL for cuda:local_rank tensors (CUDA builds; the unique id travels over MPI).
  void init_nccl();
  NcclComm* nccl() const { return nccl_.get(); }
  // Collectives issued so far (the sequence number errors name).
  int64_t collectives() const { return seq_; }
  // The bytes this rank handed to each kind of collective so far: an all_reduce's and a broadcast's
  // tensor, a reduce_scatter's input, an all_gather's output (host tensors and simulated ones).
  struct Traffic {
    int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;
  };
  Traffic traffic() const;

 private:
  ProcessGroup(LaunchInfo info, std::chrono::milliseconds timeout);
  struct Call;  // one collective's description, for agreement and errors
  void agree(const Call& c);
  void wait(void* request, const Call& c, const char* phase);
  // A simulated group's collective: checks the tensor is on meta and counts its bytes (true), or
  // does nothing for a real group (false).
  bool simulate(const char* op, const Tensor& t, int64_t Traffic::*kind);

  LaunchInfo info_;
  bool simulated_ = false;
  std::chrono::milliseconds timeout_;
  int64_t seq_ = 0;
  Traffic traffic_{};
  std::unique_ptr<NcclComm> nccl_;
};

}  // namespace mg
