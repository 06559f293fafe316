// ProcessGroup over MPI (see process_group.h). Note [Collective timeouts]: MPI's blocking
// collectives wait forever for a rank that is gone, so every collective here is the
// non-blocking form, tested in a loop until a deadline. Before its data moves, each collective
// agrees with the others on (sequence number, kind, elements, dtype, root) in one small
// all-reduce of maxima and negated minima: ranks that call different collectives (diverged code
// paths, different models) get an error listing what each rank called instead of undefined
// behaviour. All collectives are serialized by one mutex, so any thread may call them (the DDP
// communication thread does during backward) as long as every rank issues them in the same order.
#include "parallel/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/nccl_comm.h"

#ifdef MG_WITH_MPI
#include <mpi.h>
#endif

namespace mg {
namespace {

std::mutex g_mu;  // one collective at a time in this process

int env_int(const char* name, int fallback, bool* found = nullptr) {
  const char* v = std::getenv(name);
  if (found) *found = v != nullptr;
  if (!v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  MG_CHECK(end != v && *end == '\0' && x >= 0 && x < (1 << 24), "process group: environment variable ", name, "='", v,
           "' is not a rank or size");
  return int(x);
}

#ifdef MG_WITH_MPI
bool g_initialized_here = false;

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && g_initialized_here) MPI_Finalize();
}

std::string mpi_error(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, size_t(len));
}

#define MG_MPI_CHECK(stmt, what)                                                          \
  do {                                                                                    \
    const int mg_mpi_rc_ = (stmt);                                                        \
    MG_CHECK(mg_mpi_rc_ == MPI_SUCCESS, what, ": ", #stmt, " failed: ", mpi_error(mg_mpi_rc_)); \
  } while (0)

MPI_Datatype mpi_type(DType t, const char* op) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: case DType::i8: case DType::b8: return MPI_BYTE;
    default: break;
  }
  MG_THROW(op, ": dtype ", t, " has no MPI reduction (use f32, f64, i32 or i64)");
}
#endif

// The mean after a sum: t /= n (f32 and f64; integers have no mean).
void divide_(const Tensor& t, int n, const char* op) {
  if (t.dtype() == DType::f32) {
    float* d = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] /= float(n);
  } else {
    MG_CHECK(t.dtype() == DType::f64, op, ": the mean needs f32 or f64, got ", t.dtype());
    double* d = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] /= double(n);
  }
}

}  // namespace

bool mpi_is_built() {
#ifdef MG_WITH_MPI
  return true;
#else
  return false;
#endif
}

LaunchInfo launch_info_from_env() {
  LaunchInfo info;
  bool ompi = false, generic = false;
  info.rank = env_int("OMPI_COMM_WORLD_RANK", 0, &ompi);
  if (ompi) {
    info.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.source = "OMPI_COMM_WORLD_*";
  } else {
    info.rank = env_int("RANK", 0, &generic);
    info.world_size = env_int("WORLD_SIZE", 1);
    info.local_rank = env_int("LOCAL_RANK", info.rank);
    info.source = generic ? "RANK/WORLD_SIZE" : "none (one process)";
  }
  MG_CHECK(info.world_size >= 1 && info.rank < info.world_size, "process group: rank ", info.rank,
           " is not below the world size ", info.world_size, " (from ", info.source, ")");
  return info;
}

struct ProcessGroup::Call {
  enum Kind : int64_t { all_reduce = 1, reduce_scatter, all_gather, broadcast, barrier };
  Kind kind;
  int64_t count = 0;  // elements this rank passes
  DType dtype = DType::f32;
  int64_t root = 0;
  int64_t seq = 0;
  static const char* name(int64_t k) {
    switch (k) {
      case all_reduce: return "all_reduce";
      case reduce_scatter: return "reduce_scatter";
      case all_gather: return "all_gather";
      case broadcast: return "broadcast";
      case barrier: return "barrier";
    }
    return "unknown collective";
  }
  std::string str() const {
    std::string s = detail::str_cat(name(kind), " #", seq);
    if (kind != barrier) s += detail::str_cat(" of ", count, " ", dtype, " elements");
    if (kind == broadcast) s += detail::str_cat(" from rank ", root);
    return s;
  }
};

std::chrono::milliseconds ProcessGroup::default_timeout() {
  if (const char* v = std::getenv("MEMGRAD_DDP_TIMEOUT_S")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    MG_CHECK(end != v && *end == '\0' && s > 0, "MEMGRAD_DDP_TIMEOUT_S='", v, "' is not a positive number of seconds");
    return std::chrono::milliseconds(int64_t(s * 1000));
  }
  return std::chrono::seconds(300);
}

ProcessGroup::ProcessGroup(LaunchInfo info, std::chrono::milliseconds timeout) : info_(std::move(info)), timeout_(timeout) {}
ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::simulated(int rank, int world_size) {
  MG_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "process group: a simulated rank ", rank, " of ",
           world_size, " ranks does not exist");
  LaunchInfo info{.rank = rank, .world_size = world_size, .local_rank = rank, .source = "simulated"};
  std::shared_ptr<ProcessGroup> g(new ProcessGroup(info, default_timeout()));
  g->simulated_ = true;
  return g;
}

bool ProcessGroup::simulate(const char* op, const Tensor& t, int64_t Traffic::*kind) {
  if (!simulated_) return false;
  MG_CHECK(t.device().is_meta(), op, ": a simulated rank (rank ", info_.rank, " of ", info_.world_size,
           ") moves meta tensors only, got one on ", t.device().str());
  std::lock_guard<std::mutex> lk(g_mu);
  ++seq_;
  traffic_.*kind += int64_t(t.nbytes());
  return true;
}

ProcessGroup::Traffic ProcessGroup::traffic() const {
  std::lock_guard<std::mutex> lk(g_mu);
  return traffic_;
}

std::shared_ptr<ProcessGroup> ProcessGroup::world(std::chrono::milliseconds timeout) {
  LaunchInfo info = launch_info_from_env();
  // One process that no launcher started needs no MPI (and no singleton MPI start-up).
  if (info.world_size == 1) return std::shared_ptr<ProcessGroup>(new ProcessGroup(info, timeout));
#ifdef MG_WITH_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    g_initialized_here = true;
    std::atexit(finalize_mpi);
    MG_CHECK(provided >= MPI_THREAD_SERIALIZED, "process group: this MPI gives thread level ", provided,
             "; memgrad needs MPI_THREAD_SERIALIZED (the DDP communication thread issues collectives)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MG_CHECK(info.rank == rank && info.world_size == size, "process group: the launcher says rank ", info.rank, " of ",
           info.world_size, " (", info.source, ") but MPI says rank ", rank, " of ", size,
           "\n  hint: start the ranks with mpirun (RANK/WORLD_SIZE alone cannot connect them)");
#else
  MG_CHECK(info.world_size == 1, "process group: the launcher started ", info.world_size,
           " ranks (", info.source, ") but this memgrad was built without MPI",
           "\n  hint: install libopenmpi-dev (scripts/setup) and reconfigure with -DMG_MPI=ON");
#endif
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(info, timeout));
}

void ProcessGroup::wait(void* request, const Call& c, const char* phase) {
#ifdef MG_WITH_MPI
  MPI_Request* req = static_cast<MPI_Request*>(request);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  int spins = 0;
  for (;;) {
    int done = 0;
    MG_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE), c.str());
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      MG_THROW("process group: ", c.str(), " on rank ", info_.rank, " of ", info_.world_size, ": the other ranks did not ",
               phase, " within ", double(timeout_.count()) / 1000.0,
               " s; expected every rank to call ", Call::name(c.kind), " as collective #", c.seq,
               " (a rank exited early, crashed, hangs, or runs other code)",
               "\n  hint: the limit is MEMGRAD_DDP_TIMEOUT_S (or --ddp-timeout)");
    }
    // Open MPI progresses non-blocking collectives inside MPI_Test: spin briefly, then yield.
    if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
#else
  (void)request, (void)c, (void)phase;
#endif
}

void ProcessGroup::agree(const Call& c) {
#ifdef MG_WITH_MPI
  // Maxima of the fields and of their negations: equal everywhere iff max == -max(-x).
  int64_t f[5] = {c.seq, c.kind, c.count, int64_t(c.dtype), c.root};
  int64_t in[10], out[10];
  for (int i = 0; i < 5; ++i) in[i] = f[i], in[5 + i] = -f[i];
  MPI_Request req;
  MG_MPI_CHECK(MPI_Iallreduce(in, out, 10, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD, &req), c.str());
  wait(&req, c, "join");
  bool same = true;
  for (int i = 0; i < 5; ++i) same = same && out[i] == -out[5 + i];
  if (same) return;
  // Every rank saw the mismatch: gather each rank's call for the message.
  std::vector<int64_t> all(size_t(5 * info_.world_size));
  MG_MPI_CHECK(MPI_Iallgather(f, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, MPI_COMM_WORLD, &req), c.str());
  wait(&req, c, "report their calls");
  std::string calls;
  for (int r = 0; r < info_.world_size; ++r) {
    const int64_t* g = &all[size_t(5 * r)];
    Call o{.kind = Call::Kind(g[1]), .count = g[2], .dtype = DType(g[3]), .root = g[4], .seq = g[0]};
    calls += detail::str_cat("\n  rank ", r, ": ", o.str());
  }
  MG_THROW("process group: the ranks called different collectives (rank ", info_.rank, " expected every rank to call ",
           c.str(), "):", calls, "\n  hint: every rank must run the same model and the same steps in the same order");
#else
  (void)c;
#endif
}

void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) {
  MG_CHECK(t.defined() && t.is_contiguous(), "all_reduce: the tensor must be defined and contiguous");
  if (simulate("all_reduce", t, &Traffic::all_reduce)) return;
  if (t.device().is_cuda()) {
    MG_CHECK(nccl_, "all_reduce: a ", t.device().str(), " tensor needs NCCL (ProcessGroup::init_nccl)");
    nccl_->all_reduce(t, op == ReduceOp::mean);
    return;
  }
  MG_CHECK(t.device().is_cpu(), "all_reduce: no backend for ", t.device().str());
  std::lock_guard<std::mutex> lk(g_mu);
  const Call c{.kind = Call::all_reduce, .count = t.numel(), .dtype = t.dtype(), .seq = seq_++};
  traffic_.all_reduce += int64_t(t.nbytes());
  if (info_.world_size == 1) return;
#ifdef MG_WITH_MPI
  agree(c);
  MPI_Request req;
  MG_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), int(t.numel()), mpi_type(t.dtype(), "all_reduce"), MPI_SUM,
                              MPI_COMM_WORLD, &req), c.str());
  wait(&req, c, "finish");
  if (op == ReduceOp::mean) {
    divide_(t, info_.world_size, "all_reduce");
  }
#endif
}

void ProcessGroup::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  MG_CHECK(in.defined() && out.defined() && in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype() &&
               in.device() == out.device(),
           "reduce_scatter: in and out must be contiguous tensors of one dtype on one device");
  MG_CHECK(in.numel() == out.numel() * info_.world_size, "reduce_scatter: in has ", in.numel(),
           " elements, expected world size ", info_.world_size, " x out's ", out.numel());
  if (simulate("reduce_scatter", in, &Traffic::reduce_scatter)) return;
  if (in.device().is_cuda()) {
    MG_CHECK(nccl_, "reduce_scatter: a ", in.device().str(), " tensor needs NCCL (ProcessGroup::init_nccl)");
    nccl_->reduce_scatter(in, out, op == ReduceOp::mean);
    return;
  }
  MG_CHECK(in.device().is_cpu(), "reduce_scatter: no backend for ", in.device().str());
  std::lock_guard<std::mutex> lk(g_mu);
  const Call c{.kind = Call::reduce_scatter, .count = in.numel(), .dtype = in.dtype(), .seq = seq_++};
  traffic_.reduce_scatter += int64_t(in.nbytes());
  if (info_.world_size == 1) {
    std::memcpy(out.data_ptr(), in.data_ptr(), out.nbytes());
    return;
  }
#ifdef MG_WITH_MPI
  agree(c);
  MPI_Request req;
  MG_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), int(out.numel()),
                                         mpi_type(in.dtype(), "reduce_scatter"), MPI_SUM, MPI_COMM_WORLD, &req),
               c.str());
  wait(&req, c, "finish");
  if (op == ReduceOp::mean) {
    divide_(out, info_.world_size, "reduce_scatter");
  }
#endif
}

void ProcessGroup::all_gather(const Tensor& in, const Tensor& out) {
  MG_CHECK(in.defined() && out.defined() && in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype() &&
               in.device() == out.device(),
           "all_gather: in and out must be contiguous tensors of one dtype on one device");
  MG_CHECK(out.numel() == in.numel() * info_.world_size, "all_gather: out has ", out.numel(),
           " elements, expected world size ", info_.world_size, " x in's ", in.numel());
  if (simulate("all_gather", out, &Traffic::all_gather)) return;
  if (in.device().is_cuda()) {
    MG_CHECK(nccl_, "all_gather: a ", in.device().str(), " tensor needs NCCL (ProcessGroup::init_nccl)");
    nccl_->all_gather(in, out);
    return;
  }
  MG_CHECK(in.device().is_cpu(), "all_gather: no backend for ", in.device().str());
  std::lock_guard<std::mutex> lk(g_mu);
  const Call c{.kind = Call::all_gather, .count = in.numel(), .dtype = in.dtype(), .seq = seq_++};
  traffic_.all_gather += int64_t(out.nbytes());
  // in may be rank r's own block of out (in place).
  const bool in_place = static_cast<const char*>(in.data_ptr()) ==
                        static_cast<const char*>(out.data_ptr()) + size_t(info_.rank) * in.nbytes();
  if (info_.world_size == 1) {
    if (!in_place) std::memcpy(out.data_ptr(), in.data_ptr(), in.nbytes());
    return;
  }
#ifdef MG_WITH_MPI
  agree(c);
  MPI_Request req;
  const MPI_Datatype type = mpi_type(in.dtype(), "all_gather");
  const int n = int(in.numel() * (type == MPI_BYTE ? int64_t(in.element_size()) : 1));
  MG_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), n, type, out.data_ptr(), n, type,
                              MPI_COMM_WORLD, &req), c.str());
  wait(&req, c, "finish");
#endif
}

void ProcessGroup::broadcast(const Tensor& t, int root) {
  MG_CHECK(t.defined() && t.is_contiguous(), "broadcast: the tensor must be defined and contiguous");
  MG_CHECK(root >= 0 && root < info_.world_size, "broadcast: root ", root, " is not a rank of ", info_.world_size);
  if (simulate("broadcast", t, &Traffic::broadcast)) return;
  if (t.device().is_cuda()) {
    MG_CHECK(nccl_, "broadcast: a ", t.device().str(), " tensor needs NCCL (ProcessGroup::init_nccl)");
    nccl_->broadcast(t, root);
    return;
  }
  MG_CHECK(t.device().is_cpu(), "broadcast: no backend for ", t.device().str());
  std::lock_guard<std::mutex> lk(g_mu);
  const Call c{.kind = Call::broadcast, .count = t.numel(), .dtype = t.dtype(), .root = root, .seq = seq_++};
  traffic_.broadcast += int64_t(t.nbytes());
  if (info_.world_size == 1) return;
#ifdef MG_WITH_MPI
  agree(c);
  MPI_Request req;
  MG_MPI_CHECK(MPI_Ibcast(t.data_ptr(), int(t.nbytes()), MPI_BYTE, root, MPI_COMM_WORLD, &req), c.str());
  wait(&req, c, "finish");
#endif
}

void ProcessGroup::barrier() {
  std::lock_guard<std::mutex> lk(g_mu);
  const Call c{.kind = Call::barrier, .seq = seq_++};
  if (info_.world_size == 1 || simulated_) return;
#ifdef MG_WITH_MPI
  agree(c);  // the agreement is itself a barrier
#endif
}

double ProcessGroup::all_reduce_scalar(double v, ReduceOp op) {
  if (simulated_) {  // Note [Simulated ranks]: the f64 the real one all-reduces, counted
    std::lock_guard<std::mutex> lk(g_mu);
    ++seq_;
    traffic_.all_reduce += int64_t(sizeof(double));
    return op == ReduceOp::sum ? v * info_.world_size : v;
  }
  Tensor t = empty({1}, {.dtype = DType::f64});
  t.data<double>()[0] = v;
  all_reduce(t, op);
  return t.data<double>()[0];
}

std::string ProcessGroup::broadcast_string(const std::string& s, int root) {
  if (simulated_) {  // the length and the bytes the real one broadcasts, counted
    std::lock_guard<std::mutex> lk(g_mu);
    seq_ += 2;
    traffic_.broadcast += int64_t(sizeof(int64_t) + std::max<size_t>(s.size(), 1));
    return s;
  }
  Tensor n = empty({1}, {.dtype = DType::i64});
  n.data<int64_t>()[0] = int64_t(s.size());
  broadcast(n, root);
  const int64_t len = n.data<int64_t>()[0];
  Tensor bytes = empty({std::max<int64_t>(len, 1)}, {.dtype = DType::u8});
  if (info_.rank == root) std::memcpy(bytes.data_ptr(), s.data(), s.size());
  broadcast(bytes, root);
  return std::string(static_cast<const char*>(bytes.data_ptr()), size_t(len));
}

void ProcessGroup::init_nccl() {
  MG_CHECK(!simulated_, "process group: a simulated rank has no NCCL (it moves meta tensors only)");
  if (!nccl_) nccl_ = NcclComm::create(*this);
}

}  // namespace mg
