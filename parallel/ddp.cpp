// DistributedDataParallel (see ddp.h). Note [Bucket order]: collectives must be issued in the
// same order on every rank, so buckets launch strictly by index (bucket i waits for i-1 even if
// it is ready first), and everything else the step communicates (sums of counts, losses, norms,
// the ZeRO gathers, the buffers) runs on the calling thread only once the communication thread is
// idle. Buckets are filled from the last parameter backwards: backward finishes the last layers
// first, so the first bucket is ready early and its all-reduce overlaps the rest of backward.
#include "parallel/ddp.h"
#include "parallel/ddp_bucket.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/memory_category.h"
#include "ops/ops.h"

namespace mg {

using Clock = std::chrono::steady_clock;

// One worker that runs collectives in the order queued; the first error is kept and re-thrown
// by wait_idle. Tasks are destroyed on the worker, so buffers they hold are freed there.
class DistributedDataParallel::CommThread {
 public:
  CommThread() : worker_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // Blocks until every queued task ran; returns the busy seconds since the last call.
  double wait_idle() {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [&] { return queue_.empty() && !running_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    const double b = busy_s_;
    busy_s_ = 0;
    return b;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lk.unlock();
      const auto t0 = Clock::now();
      std::exception_ptr err;
      if (!error_) {  // after an error the ranks are out of step: skip the rest
        try {
          task();
        } catch (...) {
          err = std::current_exception();
        }
      }
      task = nullptr;
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      lk.lock();
      busy_s_ += s;
      if (err && !error_) error_ = err;
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false, running_ = false;
  std::exception_ptr error_;
  double busy_s_ = 0;
  std::thread worker_;
};

namespace {

std::string describe(const std::string& name, const Tensor& t) {
  return detail::str_cat(name, " ", shape_str(t.shape()), " ", t.dtype());
}

// Flat (numel) view of a contiguous tensor's storage, without autograd.
Tensor flat_view(const Tensor& t) { return view(t.detach(), {t.numel()}); }

// Every rank's model must list the same parameters and buffers; the first line that differs
// from rank 0's is named.
void check_same_model(ProcessGroup& g, const NamedTensors& params, const NamedTensors& buffers) {
  std::vector<std::string> lines;
  for (const auto& [n, p] : params) lines.push_back("parameter " + describe(n, p));
  for (const auto& [n, b] : buffers) lines.push_back("buffer " + describe(n, b));
  std::string mine;
  for (const auto& l : lines) mine += l + "\n";
  const std::string root = g.broadcast_string(mine, 0);
  std::string diff;
  if (root != mine) {
    std::vector<std::string> theirs;
    size_t at = 0;
    for (size_t nl; (nl = root.find('\n', at)) != std::string::npos; at = nl + 1) theirs.push_back(root.substr(at, nl - at));
    size_t i = 0;
    while (i < lines.size() && i < theirs.size() && lines[i] == theirs[i]) ++i;
    diff = detail::str_cat("rank ", g.rank(), " has ", i < lines.size() ? lines[i] : "nothing more", " where rank 0 has ",
                           i < theirs.size() ? theirs[i] : "nothing more", " (", lines.size(), " vs ", theirs.size(),
                           " tensors)");
  }
  const double differing = g.all_reduce_scalar(diff.empty() ? 0.0 : 1.0);
  MG_CHECK(differing == 0, "DDP: the ranks hold different models (", int(differing), " of ", g.world_size(),
           " ranks differ from rank 0)", diff.empty() ? "" : ": " + diff,
           "\n  hint: every rank must build the same model with the same configuration");
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Module& model, std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : model_(model), group_(std::move(group)), opt_(options), params_(model.named_parameters()) {
  MG_CHECK(group_, "DDP: no process group");
  MG_CHECK(opt_.zero >= 0 && opt_.zero <= 2, "DDP: --zero must be 0, 1 or 2, got ", opt_.zero);
  MG_CHECK(opt_.bucket_bytes > 0, "DDP: the bucket size must be positive, got ", opt_.bucket_bytes, " bytes");
  MG_CHECK(!params_.empty(), "DDP: the model has no parameters");
  for (const auto& [n, p] : params_) {
    MG_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64, "DDP: parameter '", n, "' is ", p.dtype(),
             "; data-parallel gradients are summed in f32 or f64 (bf16-pure parameters are not supported)");
    MG_CHECK(p.device().is_cpu() || (p.device().is_cuda() && group_->nccl()) ||
                 (p.device().is_meta() && group_->is_simulated()),
             "DDP: parameter '", n, "' is on ", p.device().str(),
             "; host tensors go over MPI, cuda:N tensors need ProcessGroup::init_nccl(), meta tensors a simulated group");
    MG_CHECK(p.is_contiguous(), "DDP: parameter '", n, "' is not contiguous");
  }
  const NamedTensors buffers = model.named_buffers();
  check_same_model(*group_, params_, buffers);
  {
    NoGradGuard no_grad;
    for (const auto& [_, p] : params_) group_->broadcast(p.detach(), 0);
    for (const auto& [_, b] : buffers) group_->broadcast(b.detach(), 0);
  }

  // Buckets from the last parameter backwards (Note [Bucket order]).
  const int64_t N = group_->world_size();
  bucket_of_.resize(params_.size());
  offset_of_.resize(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k].second;
    Bucket* b = buckets_.empty() ? nullptr : buckets_.back().get();
    if (!b || b->dtype != p.dtype() || b->device != p.device() ||
        (b->numel > 0 && (b->numel + p.numel()) * int64_t(p.element_size()) > opt_.bucket_bytes)) {
      buckets_.push_back(std::make_unique<Bucket>());
      b = buckets_.back().get();
      b->dtype = p.dtype();
      b->device = p.device();
    }
    b->params.push_back(k);
    b->offsets.push_back(b->numel);
    offset_of_[k] = b->numel;
    b->numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& b : buckets_) {
    b->padded = (b->numel + N - 1) / N * N;
    if (opt_.zero == 0) continue;
    const int64_t len = b->padded / N, lo = group_->rank() * len, hi = lo + len;
    for (size_t j = 0; j < b->params.size(); ++j) {
      const int64_t off = b->offsets[j], n = params_[b->params[j]].second.numel();
      const int64_t s = std::max(lo, off), e = std::min(hi, off + n);
      if (s >= e) continue;
      const auto& [name, p] = params_[b->params[j]];
      b->pieces.push_back({b->params[j], s, e - s, detail::str_cat(name, "[", s - off, ":", e - off, "]"),
                           narrow(flat_view(p), 0, s - off, e - s)});
    }
  }

  // The hooks outlive nothing: they hold a shared pointer that the destructor clears.
  auto self = std::make_shared<DistributedDataParallel*>(this);
  alive_ = self;
  for (size_t k = 0; k < params_.size(); ++k)
    params_[k].second.add_grad_ready_hook([self, k](const Tensor&) {
      if (*self) (*self)->on_grad_ready(k);
    });
  comm_ = std::make_unique<CommThread>();
}

DistributedDataParallel::~DistributedDataParallel() {
  if (alive_) *alive_ = nullptr;
}

int64_t DistributedDataParallel::num_buckets() const { return int64_t(buckets_.size()); }

int64_t DistributedDataParallel::padded_elements() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b->padded;
  return n;
}

std::string DistributedDataParallel::str() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) bytes += b->padded * int64_t(dtype_size(b->dtype));
  char mb[32];
  std::snprintf(mb, sizeof mb, "%.1f", double(bytes) / 1e6);
  return detail::str_cat("DDP over ", group_->world_size(), " ranks, ", buckets_.size(), " bucket",
                         buckets_.size() == 1 ? "" : "s", " (", mb, " MB of gradients)",
                         opt_.zero ? detail::str_cat(", ZeRO-", opt_.zero) : std::string());
}

std::vector<ParamGroup> DistributedDataParallel::optimizer_groups(const std::vector<ParamGroup>& groups) const {
  if (opt_.zero == 0) return groups;
  std::map<std::string, std::vector<const Bucket::Piece*>> pieces;
  std::map<std::string, size_t> known;
  for (size_t k = 0; k < params_.size(); ++k) known[params_[k].first] = k;
  for (const auto& b : buckets_)
    for (const auto& pc : b->pieces) pieces[params_[pc.param].first].push_back(&pc);
  std::vector<ParamGroup> out;
  group_sizes_.clear();
  group_pieces_.clear();
  for (const auto& g : groups) {
    group_sizes_.push_back(int64_t(g.params.size()));
    ParamGroup s{.name = g.name, .params = {}, .lr = g.lr, .weight_decay = g.weight_decay};
    for (const auto& [n, _] : g.params) {
      MG_CHECK(known.count(n), "DDP: the optimizer's parameter '", n, "' is not a parameter of the model");
      for (const auto* pc : pieces[n]) s.params.emplace_back(pc->name, pc->view);
    }
    group_pieces_.push_back(int64_t(s.params.size()));
    out.push_back(std::move(s));
  }
  return out;
}

double DistributedDataParallel::sum_across(double local) { return group_->all_reduce_scalar(local); }

// Note [Lazy buckets]: a bucket's buffer is allocated when the first of its gradients is ready,
// and each gradient moves into its view as it becomes ready (the engine's fresh tensor is freed
// at once); later micro-batches accumulate straight into the views. Allocating every bucket
// before the forward would hold the whole gradient through the activations' peak, which one
// process does not: this way the gradient bytes appear during backward, bucket by bucket.
void DistributedDataParallel::adopt_gradient(size_t k) {
  Bucket& b = *buckets_[bucket_of_[k]];
  const Tensor& p = params_[k].second;
  NoGradGuard no_grad;
  if (!b.flat.defined()) {
    MemoryCategoryGuard tag(MemoryCategory::gradient);
    b.flat = zeros({b.padded}, {.dtype = b.dtype, .device = b.device});
  }
  const Tensor& g = p.grad();
  if (g.defined() && g.storage() == b.flat.storage()) return;  // already its view
  Tensor v = view(narrow(b.flat, 0, offset_of_[k], p.numel()), p.shape());
  if (g.defined()) copy_(v, g);
  p.set_grad(v);
}

void DistributedDataParallel::before_micro_batch(int64_t index, int64_t count) {
  if (opt_.zero == 2 && index > 0) {  // what the previous pass left (unused parameters) goes now
    for (auto& b : buckets_) b->ready = true;
    launch_ready();
  }
  syncing_ = opt_.zero == 2 || index == count - 1;  // no_sync for all but the last micro-batch
  for (auto& b : buckets_) {
    b->pending = int64_t(b->params.size());
    b->ready = b->launched = false;
  }
  next_launch_ = 0;
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  if (opt_.zero < 2) adopt_gradient(k);  // Note [Lazy buckets]
  if (!syncing_) return;
  Bucket& b = *buckets_[bucket_of_[k]];
  if (--b.pending == 0) b.ready = true;
  launch_ready();
}

void DistributedDataParallel::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->ready) launch(*buckets_[next_launch_++]);
}

void DistributedDataParallel::launch(Bucket& b) {
  b.launched = true;
  ProcessGroup* g = group_.get();
  if (opt_.zero < 2) {
    communicate([g, flat = b.flat] { g->all_reduce(flat, ReduceOp::sum); });
    return;
  }
  // Stage 2: this pass's gradients into a flat buffer, dropped from the parameters, then
  // reduce-scattered into (or added to) this rank's shard. Note [One bucket in flight]: the
  // previous bucket's buffers are freed first, here, once its reduce-scatter is done.
  retire_in_flight();
  NoGradGuard no_grad;
  Tensor flat, part;
  {
    MemoryCategoryGuard tag(MemoryCategory::gradient);
    flat = zeros({b.padded}, {.dtype = b.dtype, .device = b.device});
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params_[b.params[j]].second;
      if (!p.grad().defined()) continue;
      copy_(narrow(flat, 0, b.offsets[j], p.numel()), flat_view(p.grad()));
      p.set_grad(Tensor());
    }
    const int64_t len = b.padded / group_->world_size();
    if (!b.shard.defined()) {
      b.shard = zeros({len}, {.dtype = b.dtype, .device = b.device});
      part = b.shard;
    }
  }
  if (!part.defined()) {
    MemoryCategoryGuard tag(MemoryCategory::workspace);
    part = empty(b.shard.shape(), {.dtype = b.dtype, .device = b.device});
    communicate([g, flat, part, shard = b.shard] {
      g->reduce_scatter(flat, part, ReduceOp::sum);
      accumulate_(shard, part);
    });
    in_flight_ = {flat, part};
  } else {
    communicate([g, flat, part] { g->reduce_scatter(flat, part, ReduceOp::sum); });
    in_flight_ = {flat};
  }
}

// Note [One bucket in flight]: under ZeRO-2 a bucket's flat buffer (and a later micro-batch's
// scratch shard) lives from its launch until the next bucket's launch or the end of backward,
// where the main thread waits for its reduce-scatter and drops it. Freed on the worker instead,
// a rank's peak would depend on how fast the other ranks reach each collective; this way it holds
// at most one bucket in flight, at moments the step itself fixes, the same on every run and on a
// simulated rank (Note [Simulated ranks]). The wait is exposed communication time.
void DistributedDataParallel::retire_in_flight() {
  if (in_flight_.empty()) return;
  const auto t0 = Clock::now();
  busy_s_ += comm_->wait_idle();
  waited_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  in_flight_.clear();
}

// Note [Simulated ranks] (parallel/process_group.h): a simulated group's collectives are instant,
// so they run here, on the calling thread. Each bucket is then reduced and (ZeRO-2) freed the
// moment it is launched, as on a rank whose network keeps up with backward, and the step's memory
// is the same on every run instead of depending on when a worker thread got to it.
void DistributedDataParallel::communicate(std::function<void()> task) {
  if (group_->is_simulated()) task();
  else comm_->push(std::move(task));
}

void DistributedDataParallel::finish_gradients() {
  // Parameters without a gradient in this step (unused, or no backward ran here) get zeros.
  if (opt_.zero < 2)
    for (size_t k = 0; k < params_.size(); ++k) adopt_gradient(k);
  for (auto& b : buckets_) b->ready = true;  // unused parameters fire no hook (Note [Bucket order])
  launch_ready();
  syncing_ = false;
  const auto t0 = Clock::now();
  comm_s_ = busy_s_ + comm_->wait_idle();
  exposed_s_ = waited_s_ + std::chrono::duration<double>(Clock::now() - t0).count();
  busy_s_ = waited_s_ = 0;
  in_flight_.clear();
  if (opt_.zero == 0) return;
  // The optimizer's pieces read their slice of the summed gradients.
  const int64_t N = group_->world_size();
  for (auto& b : buckets_) {
    const int64_t lo = group_->rank() * (b->padded / N);
    for (auto& pc : b->pieces)
      pc.view.set_grad(opt_.zero == 1 ? narrow(b->flat, 0, pc.begin, pc.length) : narrow(b->shard, 0, pc.begin - lo, pc.length));
  }
}

void DistributedDataParallel::gather_parameters() {
  NoGradGuard no_grad;
  const int64_t N = group_->world_size();
  for (auto& b : buckets_) {
    Tensor all = b->flat;  // stage 1: the gradients are spent, their buffer takes the parameters
    if (!all.defined()) {
      MemoryCategoryGuard tag(MemoryCategory::workspace);
      all = empty({b->padded}, {.dtype = b->dtype, .device = b->device});
    }
    const int64_t len = b->padded / N, lo = group_->rank() * len;
    for (const auto& pc : b->pieces) copy_(narrow(all, 0, pc.begin, pc.length), pc.view);
    group_->all_gather(narrow(all, 0, lo, len), all);
    for (size_t j = 0; j < b->params.size(); ++j) {
      const Tensor& p = params_[b->params[j]].second;
      copy_(flat_view(p), narrow(all, 0, b->offsets[j], p.numel()));
      p.bump_version();
    }
  }
}

void DistributedDataParallel::after_step() {
  comm_->wait_idle();
  if (opt_.zero > 0) gather_parameters();
  for (const auto& [_, p] : params_) p.set_grad(Tensor());
  for (auto& b : buckets_) {
    for (auto& pc : b->pieces) pc.view.set_grad(Tensor());
    b->flat = b->shard = Tensor();
  }
  // Note [Batch norm under DDP]: each rank normalizes its forward with the statistics of its own
  // shard (PyTorch DDP without SyncBatchNorm), so a DDP step equals one process running
  // micro-batches of one shard each. The running statistics (buffers) then follow rank 0's, as
  // PyTorch's broadcast_buffers: every rank evaluates and checkpoints the same model.
  broadcast_buffers();
}

void DistributedDataParallel::broadcast_buffers() {
  // One broadcast per dtype and device: the buffers packed into a flat tensor and back.
  NoGradGuard no_grad;
  const NamedTensors buffers = model_.named_buffers();
  std::vector<bool> done(buffers.size(), false);
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (done[i]) continue;
    const Tensor& first = buffers[i].second;
    std::vector<size_t> same;
    int64_t n = 0;
    for (size_t j = i; j < buffers.size(); ++j)
      if (!done[j] && buffers[j].second.dtype() == first.dtype() && buffers[j].second.device() == first.device()) {
        same.push_back(j);
        n += buffers[j].second.numel();
        done[j] = true;
      }
    MemoryCategoryGuard tag(MemoryCategory::workspace);
    Tensor flat = empty({n}, {.dtype = first.dtype(), .device = first.device()});
    int64_t at = 0;
    for (size_t j : same) {
      const Tensor& b = buffers[j].second;
      copy_(narrow(flat, 0, at, b.numel()), reshape(b.detach(), {b.numel()}));
      at += b.numel();
    }
    group_->broadcast(flat, 0);
    at = 0;
    for (size_t j : same) {
      const Tensor& b = buffers[j].second;
      copy_(b.detach(), view(narrow(flat, 0, at, b.numel()), b.shape()));
      at += b.numel();
    }
  }
}

}  // namespace mg
