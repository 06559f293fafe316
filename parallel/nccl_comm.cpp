// NCCL collectives (see nccl_comm.h). Without MG_WITH_NCCL only the error path is compiled.
#include "parallel/nccl_comm.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "parallel/process_group.h"

#ifdef MG_WITH_NCCL
#include <nccl.h>

#include "core/cuda/backend.h"
#include "core/cuda/context.h"
#include "ops/ops.h"
#endif

namespace mg {

#ifdef MG_WITH_NCCL
namespace {

#define MG_NCCL_CHECK(stmt)                                                                  \
  do {                                                                                       \
    ncclResult_t mg_nr_ = (stmt);                                                            \
    MG_CHECK(mg_nr_ == ncclSuccess, "NCCL error: ", #stmt, ": ", ncclGetErrorString(mg_nr_)); \
  } while (0)

ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: case DType::i8: case DType::b8: return ncclUint8;
    default: break;
  }
  MG_THROW(op, ": dtype ", t, " has no NCCL type");
}

class NcclCommImpl final : public NcclComm {
 public:
  NcclCommImpl(ProcessGroup& g) : group_(g), device_(g.local_rank()) {
    MG_CHECK(device_ < cuda::device_count(), "NCCL: local rank ", device_, " needs cuda:", device_, " but this machine has ",
             cuda::device_count(), " GPUs");
    ncclUniqueId id;
    if (g.rank() == 0) MG_NCCL_CHECK(ncclGetUniqueId(&id));
    Tensor bytes = empty({int64_t(sizeof id)}, {.dtype = DType::u8});
    std::memcpy(bytes.data_ptr(), &id, sizeof id);
    g.broadcast(bytes, 0);  // over MPI
    std::memcpy(&id, bytes.data_ptr(), sizeof id);
    cuda::DeviceGuard guard(device_);
    MG_NCCL_CHECK(ncclCommInitRank(&comm_, g.world_size(), id, g.rank()));
  }
  ~NcclCommImpl() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int device() const override { return device_; }

  void all_reduce(const Tensor& t, bool mean) override {
    check(t, "all_reduce");
    run("all_reduce", [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.dtype(), "all_reduce"),
                           mean ? ncclAvg : ncclSum, comm_, s);
    });
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, bool mean) override {
    check(in, "reduce_scatter"), check(out, "reduce_scatter");
    run("reduce_scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), nccl_type(in.dtype(), "reduce_scatter"),
                               mean ? ncclAvg : ncclSum, comm_, s);
    });
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    check(in, "all_gather"), check(out, "all_gather");
    run("all_gather", [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), nccl_type(in.dtype(), "all_gather"), comm_, s);
    });
  }
  void broadcast(const Tensor& t, int root) override {
    check(t, "broadcast");
    run("broadcast", [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, s);
    });
  }

 private:
  void check(const Tensor& t, const char* op) const {
    MG_CHECK(t.device().is_cuda() && t.device().index == device_, "NCCL ", op, ": rank ", group_.rank(),
             " drives cuda:", device_, " but the tensor is on ", t.device().str());
  }
  // Queues the collective on memgrad's stream and polls it against the group's deadline.
  template <typename F>
  void run(const char* op, F&& enqueue) {
    cuda::DeviceGuard guard(device_);
    cudaStream_t s = cuda::stream(device_);
    MG_NCCL_CHECK(enqueue(s));
    const auto deadline = std::chrono::steady_clock::now() + group_.timeout();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) return;
      MG_CHECK(q == cudaErrorNotReady, "NCCL ", op, ": ", cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      MG_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        MG_THROW("NCCL ", op, " on rank ", group_.rank(), " of ", group_.world_size(), " (cuda:", device_, "): ",
                 async != ncclSuccess ? std::string(ncclGetErrorString(async))
                                      : detail::str_cat("the other ranks did not finish within ",
                                                        double(group_.timeout().count()) / 1000.0, " s"),
                 "; expected every rank to call ", op, " in the same order");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  ProcessGroup& group_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_is_built() { return true; }
std::unique_ptr<NcclComm> NcclComm::create(ProcessGroup& group) { return std::make_unique<NcclCommImpl>(group); }

#else

bool nccl_is_built() { return false; }
std::unique_ptr<NcclComm> NcclComm::create(ProcessGroup&) {
  MG_THROW("NCCL: this memgrad was built without CUDA/NCCL; cuda:N collectives need the CUDA build (scripts/build-cuda)");
}

#endif

}  // namespace mg
