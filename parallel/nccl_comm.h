// NcclComm: the ProcessGroup's collectives on cuda:N tensors through NCCL. Rank 0 makes the
// unique id and broadcasts it over MPI; each rank drives cuda:LOCAL_RANK (NCCL allows one rank per
// GPU). Collectives run on memgrad's stream of that device (core/cuda/context.h), so they are
// ordered with the kernels that made the data; each waits for completion against the group's
// deadline (Note [Collective timeouts]) and aborts the communicator on a timeout or an
// asynchronous NCCL error. Built only in CUDA builds (MG_WITH_NCCL); elsewhere create() throws.
#pragma once
#include <memory>

#include "core/tensor.h"

namespace mg {

class ProcessGroup;

class NcclComm {
 public:
  // Collective over the whole group: every rank must call it.
  static std::unique_ptr<NcclComm> create(ProcessGroup& group);
  virtual ~NcclComm() = default;
  // The same contracts as ProcessGroup's (f32, f64, f16, bf16, i32, i64; sum or mean).
  virtual void all_reduce(const Tensor& t, bool mean) = 0;
  virtual void reduce_scatter(const Tensor& in, const Tensor& out, bool mean) = 0;
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual int device() const = 0;  // the cuda index this rank drives
};

// Whether this build has NCCL.
bool nccl_is_built();

}  // namespace mg
