// DataLoader: turns a Dataset into batches (B, ...) by stacking examples, with per-epoch seeded
// shuffling and a background thread that prepares at most `prefetch` batches ahead of the
// training loop (a bounded queue, so prefetching costs a known number of batch buffers). Batch
// tensors are tagged MemoryCategory::input. The position (epoch, batch) can be saved with a
// checkpoint and restored, and the resumed loader yields exactly the batch that came next.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace mg {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;       // shuffling order of epoch e is a pure function of (seed, e)
  bool drop_last = false;  // drop the last, smaller batch of an epoch
  int64_t prefetch = 2;    // batches prepared ahead on a background thread; 0 = built in next()
  Device device = kCPU;    // where batch tensors are allocated
  // Data parallelism: every rank reads the same global batches (same order, same positions) and
  // keeps rows [count * r / N, count * (r + 1) / N) of each, so the ranks' shards are disjoint and
  // together the global batch; a checkpoint's position resumes every rank exactly.
  int64_t shard_rank = 0, shard_count = 1;
};

// Where a loader stands: the next batch it returns is batch `batch` of epoch `epoch`.
// batch == batches_per_epoch() means the epoch is done (next() returns nullopt).
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

struct Batch {
  Tensor input;   // (B, ...) the examples' inputs stacked; B = batch_size except maybe the last
  Tensor target;  // (B, ...) stacked targets, undefined if the dataset has none
  LoaderPosition position;  // which batch this is
  int64_t size() const { return input.size(0); }
};

// The consumer side (next, set_position, ...) is meant for one thread: the training loop.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();  // stops and joins the prefetch thread
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch of the current epoch, or nullopt once the epoch is done (the loader then
  // moves to the start of the next epoch). Re-throws an error raised while building the batch
  // (a bad file, ...); it is re-thrown on every call until set_position/set_epoch.
  std::optional<Batch> next();
  // The next batch, moving on to the next epoch when this one is done (step-based loops).
  Batch next_step();

  int64_t epoch() const { return pos_.epoch; }
  // Starts epoch `e` from its first batch (a no-op when already there).
  void set_epoch(int64_t e);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  LoaderPosition position() const { return pos_; }
  // Continues from `p` (0 <= p.batch <= batches_per_epoch()); prefetched batches are dropped.
  void set_position(LoaderPosition p);

  // Dataset indices of the examples of batch p.batch in epoch p.epoch, in batch order (this
  // rank's shard of it).
  std::vector<int64_t> batch_indices(LoaderPosition p) const;
  const DataLoaderOptions& options() const { return opt_; }
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }

 private:
  struct Item {
    LoaderPosition pos;
    Batch batch;
    std::exception_ptr error;
  };
  // The order of the dataset in epoch e: identity, or a seeded Fisher-Yates permutation.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  Batch make_batch(const std::vector<int64_t>& order, LoaderPosition p) const;
  // The first row in the epoch's order and the row count of this shard of batch p.
  std::pair<int64_t, int64_t> shard_rows(LoaderPosition p) const;
  void worker_loop(LoaderPosition start);
  void stop_worker();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opt_;
  int64_t num_examples_ = 0;
  int64_t batches_per_epoch_ = 0;
  LoaderPosition pos_;       // the consumer's position
  std::exception_ptr error_;  // a worker error, re-thrown until the position is reset

  // Shared with the worker, under mu_.
  std::mutex mu_;
  std::condition_variable ready_cv_;  // an item was queued
  std::condition_variable space_cv_;  // the queue has room, or stop_
  std::deque<Item> queue_;            // at most opt_.prefetch items
  bool stop_ = false;
  std::thread worker_;

  // Synchronous mode (prefetch == 0): the order of the epoch in pos_, cached.
  std::vector<int64_t> sync_order_;
  int64_t sync_order_epoch_ = -1;
};

}  // namespace mg
