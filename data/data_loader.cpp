// DataLoader (see data_loader.h): batching, seeded shuffling and the bounded prefetch thread.
//
// Note [Prefetch bound] The worker waits for room in the queue *before* it builds a batch, so
// at most `prefetch` batches exist beyond those the training loop holds: queued ones plus the
// one being built never exceed `prefetch`. Examples are copied into the batch one at a time,
// so only one example is alive next to the batch while it is built.
#include "data/data_loader.h"

#include <algorithm>
#include <numeric>

#include "autograd/grad_mode.h"
#include "core/memory_category.h"
#include "ops/ops.h"

namespace mg {

namespace {

// The batch row `i` of `batch` (B, ...) as a contiguous view with the example's shape.
Tensor batch_row(const Tensor& batch, int64_t i) {
  Shape row_shape(batch.shape().begin() + 1, batch.shape().end());
  return batch.as_strided(row_shape, contiguous_strides(row_shape), batch.storage_offset() + i * numel_of(row_shape));
}

// Copies one example tensor into its row, checking it matches the batch's first example.
void copy_into_row(const Tensor& batch, int64_t row, const Tensor& x, const char* what, int64_t index,
                   LoaderPosition p) {
  Shape row_shape(batch.shape().begin() + 1, batch.shape().end());
  MG_CHECK(x.defined(), "DataLoader: example ", index, " (batch ", p.batch, " of epoch ", p.epoch, ") has no ",
           what, " but the batch's first example has one");
  MG_CHECK(x.shape() == row_shape && x.dtype() == batch.dtype(), "DataLoader: example ", index, " (batch ", p.batch,
           " of epoch ", p.epoch, ") has ", what, " shape ", x.shape(), " ", x.dtype(), " but the batch's first example has ",
           row_shape, " ", batch.dtype(), "; examples must agree to be stacked",
           "\n  hint: resize images to one size (transforms.h: resize) before batching");
  // copy_ between devices needs contiguous memory; within one device it takes any strides.
  Tensor src = (x.device() != batch.device() && !x.is_contiguous()) ? contiguous(x) : x;
  copy_(batch_row(batch, row), src);
}

Tensor new_batch_tensor(const Tensor& first, int64_t count, Device device) {
  Shape shape{count};
  shape.insert(shape.end(), first.shape().begin(), first.shape().end());
  return empty(shape, {.dtype = first.dtype(), .device = device});
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), opt_(options) {
  MG_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  MG_CHECK(opt_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", opt_.batch_size);
  MG_CHECK(opt_.prefetch >= 0, "DataLoader: prefetch must be >= 0 (0 = no background thread), got ", opt_.prefetch);
  MG_CHECK(opt_.shard_count >= 1 && opt_.shard_rank >= 0 && opt_.shard_rank < opt_.shard_count, "DataLoader: shard ",
           opt_.shard_rank, " of ", opt_.shard_count, " does not exist");
  MG_CHECK(opt_.batch_size >= opt_.shard_count, "DataLoader: a batch of ", opt_.batch_size, " cannot give each of ",
           opt_.shard_count, " shards a row");
  num_examples_ = dataset_->size();
  MG_CHECK(num_examples_ > 0, "DataLoader: the dataset is empty (size() = ", num_examples_, ")");
  batches_per_epoch_ = opt_.drop_last ? num_examples_ / opt_.batch_size
                                      : (num_examples_ + opt_.batch_size - 1) / opt_.batch_size;
  MG_CHECK(batches_per_epoch_ > 0, "DataLoader: the dataset has ", num_examples_,
           " examples, fewer than batch_size ", opt_.batch_size, " with drop_last, so an epoch has no batch");
}

DataLoader::~DataLoader() { stop_worker(); }

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(num_examples_));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!opt_.shuffle) return order;
  // Fisher-Yates from the end; swap partner i draws its 64 bits at stream position i, so the
  // permutation depends on (seed, epoch) only.
  Generator g(derive_seed(opt_.seed, {uint64_t(epoch)}));
  for (int64_t i = num_examples_ - 1; i > 0; --i) {
    auto j = int64_t(bounded(bits64_at(g, uint64_t(i)), uint64_t(i + 1)));
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

std::pair<int64_t, int64_t> DataLoader::shard_rows(LoaderPosition p) const {
  const int64_t first = p.batch * opt_.batch_size;
  const int64_t count = std::min(opt_.batch_size, num_examples_ - first);
  const int64_t r = opt_.shard_rank, n = opt_.shard_count;
  const int64_t b = count * r / n, e = count * (r + 1) / n;
  return {first + b, e - b};
}

std::vector<int64_t> DataLoader::batch_indices(LoaderPosition p) const {
  MG_CHECK(p.epoch >= 0 && p.batch >= 0 && p.batch < batches_per_epoch_, "DataLoader::batch_indices: batch ",
           p.batch, " of epoch ", p.epoch, " does not exist (", batches_per_epoch_, " batches per epoch)");
  std::vector<int64_t> order = epoch_order(p.epoch);
  const auto [first, count] = shard_rows(p);
  return {order.begin() + first, order.begin() + first + count};
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, LoaderPosition p) const {
  MemoryCategoryGuard category(MemoryCategory::input);
  OpNameGuard op("data_loader");  // what the profiler shows for batch buffers
  NoGradGuard no_grad;
  const auto [first, count] = shard_rows(p);
  MG_CHECK(count > 0, "DataLoader: batch ", p.batch, " of epoch ", p.epoch, " has no rows for shard ", opt_.shard_rank,
           " of ", opt_.shard_count, " (batch size ", opt_.batch_size, ")");
  Batch batch;
  batch.position = p;
  for (int64_t i = 0; i < count; ++i) {
    int64_t index = order[size_t(first + i)];
    Example ex = dataset_->get(index, p.epoch);
    MG_CHECK(ex.input.defined(), "DataLoader: example ", index, " (batch ", p.batch, " of epoch ", p.epoch,
             ") has no input tensor");
    if (i == 0) {
      batch.input = new_batch_tensor(ex.input, count, opt_.device);
      if (ex.target.defined()) batch.target = new_batch_tensor(ex.target, count, opt_.device);
    }
    copy_into_row(batch.input, i, ex.input, "input", index, p);
    if (batch.target.defined()) {
      copy_into_row(batch.target, i, ex.target, "target", index, p);
    } else {
      MG_CHECK(!ex.target.defined(), "DataLoader: example ", index, " has a target but the batch's first example has none");
    }
  }
  return batch;
}

void DataLoader::worker_loop(LoaderPosition p) {
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  for (;;) {
    {  // Note [Prefetch bound]: wait for room before building.
      std::unique_lock<std::mutex> lk(mu_);
      space_cv_.wait(lk, [&] { return stop_ || int64_t(queue_.size()) < opt_.prefetch; });
      if (stop_) return;
    }
    if (p.batch == batches_per_epoch_) p = {p.epoch + 1, 0};
    Item item{p, {}, nullptr};
    try {
      if (order_epoch != p.epoch) {
        order = epoch_order(p.epoch);
        order_epoch = p.epoch;
      }
      item.batch = make_batch(order, p);
    } catch (...) {
      item.error = std::current_exception();
    }
    bool failed = item.error != nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      queue_.push_back(std::move(item));
    }
    ready_cv_.notify_one();
    if (failed) return;  // the consumer re-throws; a new position restarts the worker
    ++p.batch;
  }
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  space_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lk(mu_);
  queue_.clear();
  stop_ = false;
}

std::optional<Batch> DataLoader::next() {
  if (error_) std::rethrow_exception(error_);
  if (pos_.batch == batches_per_epoch_) {
    pos_ = {pos_.epoch + 1, 0};
    return std::nullopt;
  }
  if (opt_.prefetch == 0) {  // synchronous: build it here
    if (sync_order_epoch_ != pos_.epoch) {
      sync_order_ = epoch_order(pos_.epoch);
      sync_order_epoch_ = pos_.epoch;
    }
    try {
      Batch b = make_batch(sync_order_, pos_);
      ++pos_.batch;
      return b;
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }
  if (!worker_.joinable()) worker_ = std::thread([this, start = pos_] { worker_loop(start); });
  Item item;
  {
    std::unique_lock<std::mutex> lk(mu_);
    ready_cv_.wait(lk, [&] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  space_cv_.notify_one();
  MG_INTERNAL_ASSERT(item.pos == pos_, "DataLoader: the worker produced batch ", item.pos.batch, " of epoch ",
                     item.pos.epoch, " but batch ", pos_.batch, " of epoch ", pos_.epoch, " was expected");
  if (item.error) {
    error_ = item.error;
    std::rethrow_exception(error_);
  }
  ++pos_.batch;
  return std::move(item.batch);
}

Batch DataLoader::next_step() {
  std::optional<Batch> b = next();
  if (!b) b = next();
  MG_INTERNAL_ASSERT(b.has_value(), "DataLoader::next_step: an epoch without batches");
  return std::move(*b);
}

void DataLoader::set_position(LoaderPosition p) {
  MG_CHECK(p.epoch >= 0 && p.batch >= 0 && p.batch <= batches_per_epoch_, "DataLoader::set_position: batch ",
           p.batch, " of epoch ", p.epoch, " is not a position (", batches_per_epoch_, " batches per epoch)");
  stop_worker();
  error_ = nullptr;
  pos_ = p;
}

void DataLoader::set_epoch(int64_t e) {
  if (pos_ == LoaderPosition{e, 0} && !error_) return;
  set_position({e, 0});
}

}  // namespace mg
