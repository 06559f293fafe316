// DataLoader: batch shapes and values, drop_last, seeded shuffling (reproducible, different per
// epoch, a permutation), the prefetch bound measured as live input bytes on cpu:14, worker
// exceptions re-thrown in order, and save/restore of the position.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "core/allocator.h"
#include "data/data_loader.h"

using namespace mg;
using Catch::Matchers::Contains;

namespace {

// Example i: input (F) f32 = [10 i, 10 i + 1, ...], target () i64 = i. Throws at `bad_index`.
class RangeDataset : public Dataset {
 public:
  explicit RangeDataset(int64_t n, int64_t features = 4, int64_t bad_index = -1)
      : n_(n), features_(features), bad_(bad_index) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index, int64_t epoch = 0) const override {
    MG_CHECK(index != bad_, "RangeDataset: example ", index, " is broken");
    std::vector<double> v(static_cast<size_t>(features_));
    for (int64_t k = 0; k < features_; ++k) v[size_t(k)] = double(10 * index + k);
    return {from_vector(v, {features_}), scalar_tensor(double(index), {.dtype = DType::i64})};
  }

 private:
  int64_t n_, features_, bad_;
};

std::vector<int64_t> targets(const Batch& b) { return b.target.to_vector<int64_t>(); }

// Every batch's targets of one epoch, concatenated.
std::vector<int64_t> epoch_targets(DataLoader& loader) {
  std::vector<int64_t> all;
  while (auto b = loader.next()) {
    auto t = targets(*b);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

}  // namespace

TEST_CASE("DataLoader stacks examples into batches", "[data][data_loader]") {
  auto ds = std::make_shared<RangeDataset>(10);
  for (int64_t prefetch : {0, 2}) {
    DataLoader loader(ds, {.batch_size = 4, .prefetch = prefetch});
    CHECK(loader.batches_per_epoch() == 3);
    auto b0 = loader.next();
    REQUIRE(b0);
    CHECK(b0->input.shape() == Shape{4, 4});
    CHECK(b0->target.shape() == Shape{4});
    CHECK(b0->input.dtype() == DType::f32);
    CHECK(b0->target.dtype() == DType::i64);
    CHECK(targets(*b0) == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(b0->input.to_vector<double>()[5] == 11.0);  // row 1, feature 1
    CHECK(loader.next()->size() == 4);
    auto b2 = loader.next();
    REQUIRE(b2);
    CHECK(b2->input.shape() == Shape{2, 4});  // the last, smaller batch
    CHECK(targets(*b2) == std::vector<int64_t>{8, 9});
    CHECK(b2->position == LoaderPosition{0, 2});
    CHECK_FALSE(loader.next());
    CHECK(loader.epoch() == 1);
    CHECK(targets(*loader.next()) == std::vector<int64_t>{0, 1, 2, 3});
  }
  DataLoader dropping(ds, {.batch_size = 4, .drop_last = true});
  CHECK(dropping.batches_per_epoch() == 2);
  CHECK(epoch_targets(dropping) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  // next_step crosses epochs.
  DataLoader stepping(ds, {.batch_size = 5});
  for (int i = 0; i < 5; ++i) {
    Batch b = stepping.next_step();
    CHECK(b.position == LoaderPosition{i / 2, i % 2});
  }
  // On meta the batch has its shape and bytes but no data.
  DataLoader meta(ds, {.batch_size = 3, .device = kMeta});
  auto m = meta.next();
  CHECK(m->input.is_meta());
  CHECK(m->input.shape() == Shape{3, 4});
}

TEST_CASE("DataLoader rejects bad options and mismatched examples", "[data][data_loader]") {
  auto ds = std::make_shared<RangeDataset>(3);
  CHECK_THROWS_WITH(DataLoader(ds, {.batch_size = 0}), Contains("batch_size must be at least 1"));
  CHECK_THROWS_WITH(DataLoader(ds, {.batch_size = 4, .drop_last = true}),
                    Contains("3 examples, fewer than batch_size 4 with drop_last"));
  CHECK_THROWS_WITH(DataLoader(std::make_shared<RangeDataset>(0)), Contains("dataset is empty"));
  CHECK_THROWS_WITH(DataLoader(nullptr), Contains("null"));

  // Example 1 has a different input shape from example 0.
  class Ragged : public Dataset {
   public:
    int64_t size() const override { return 2; }
    Example get(int64_t index, int64_t = 0) const override { return {zeros({index + 2}), Tensor()}; }
  };
  DataLoader loader(std::make_shared<Ragged>(), {.batch_size = 2});
  CHECK_THROWS_WITH(loader.next(), Contains("example 1 (batch 0 of epoch 0) has input shape (3,)") &&
                                       Contains("first example has (2,)"));
}

TEST_CASE("DataLoader shuffles reproducibly and differently per epoch", "[data][data_loader]") {
  auto ds = std::make_shared<RangeDataset>(50);
  DataLoader a(ds, {.batch_size = 8, .shuffle = true, .seed = 42});
  DataLoader b(ds, {.batch_size = 8, .shuffle = true, .seed = 42, .prefetch = 0});
  DataLoader c(ds, {.batch_size = 8, .shuffle = true, .seed = 43});
  std::vector<int64_t> a0 = epoch_targets(a), b0 = epoch_targets(b), c0 = epoch_targets(c);
  std::vector<int64_t> a1 = epoch_targets(a), b1 = epoch_targets(b);
  CHECK(a0 == b0);  // same seed, with or without the prefetch thread
  CHECK(a1 == b1);
  CHECK(a0 != a1);  // epochs differ
  CHECK(a0 != c0);  // seeds differ
  std::vector<int64_t> identity(50);
  for (int64_t i = 0; i < 50; ++i) identity[size_t(i)] = i;
  CHECK(a0 != identity);
  for (auto* order : {&a0, &a1, &c0}) {
    std::vector<int64_t> sorted = *order;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == identity);  // each epoch is a permutation
  }
  // batch_indices names the same examples; set_epoch jumps to any epoch.
  auto idx = a.batch_indices({1, 0});
  CHECK(std::vector<int64_t>(a1.begin(), a1.begin() + 8) == idx);
  a.set_epoch(0);
  CHECK(epoch_targets(a) == a0);
}

TEST_CASE("DataLoader keeps at most `prefetch` batches ahead", "[data][data_loader]") {
  // Batch: input (4, 128) f32 = 2048 B, target (4) i64 = 32 B -> 512 B block: 2560 B per batch.
  const Device dev("cpu:14");
  const int64_t batch_bytes = 2048 + 512;
  REQUIRE(memory_stats(dev).category(MemoryCategory::input).current == 0);
  reset_peak_stats(dev);
  auto live = [&] { return memory_stats(dev).category(MemoryCategory::input).current; };
  auto wait_for = [&](int64_t bytes) {
    for (int i = 0; i < 400 && live() != bytes; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // would it grow further?
    return live();
  };
  auto ds = std::make_shared<RangeDataset>(100, 128);
  {
    DataLoader loader(ds, {.batch_size = 4, .prefetch = 3, .device = dev});
    CHECK(live() == 0);  // nothing is built before the first next()
    std::optional<Batch> held = loader.next();
    CHECK(wait_for(4 * batch_bytes) == 4 * batch_bytes);  // held + 3 queued
    held.reset();
    CHECK(wait_for(3 * batch_bytes) == 3 * batch_bytes);
    for (int i = 0; i < 20; ++i) loader.next();  // batches dropped at once
    CHECK(memory_stats(dev).category(MemoryCategory::input).peak <= 4 * batch_bytes);
  }
  CHECK(live() == 0);  // the destructor stopped the worker and dropped its queue
}

TEST_CASE("DataLoader re-throws worker errors in order", "[data][data_loader]") {
  auto ds = std::make_shared<RangeDataset>(12, 4, /*bad_index=*/5);
  for (int64_t prefetch : {0, 2}) {
    DataLoader loader(ds, {.batch_size = 2, .prefetch = prefetch});
    CHECK(targets(*loader.next()) == std::vector<int64_t>{0, 1});
    CHECK(targets(*loader.next()) == std::vector<int64_t>{2, 3});
    CHECK_THROWS_WITH(loader.next(), Contains("RangeDataset: example 5 is broken"));
    CHECK_THROWS_WITH(loader.next(), Contains("example 5 is broken"));  // until repositioned
    CHECK(loader.position() == LoaderPosition{0, 2});
    loader.set_position({0, 3});
    CHECK(targets(*loader.next()) == std::vector<int64_t>{6, 7});
  }
}

TEST_CASE("DataLoader position saves and restores mid-run", "[data][data_loader]") {
  auto ds = std::make_shared<RangeDataset>(20);
  DataLoaderOptions opt{.batch_size = 6, .shuffle = true, .seed = 9};
  DataLoader first(ds, opt);
  for (int i = 0; i < 5; ++i) first.next_step();  // 4 batches per epoch: now inside epoch 1
  LoaderPosition saved = first.position();
  CHECK(saved == LoaderPosition{1, 1});
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(targets(first.next_step()));

  DataLoader resumed(ds, opt);  // a new process after a checkpoint
  resumed.set_position(saved);
  for (int i = 0; i < 6; ++i) CHECK(targets(resumed.next_step()) == expected[size_t(i)]);
  CHECK(resumed.position() == first.position());
  CHECK_THROWS_WITH(resumed.set_position({0, 5}), Contains("not a position"));
}

TEST_CASE("DataLoader shards: the ranks' rows are disjoint, make up each global batch, and resume exactly", "[data][data_loader]") {
  auto ds = std::make_shared<RangeDataset>(50);
  const DataLoaderOptions base{.batch_size = 7, .shuffle = true, .seed = 3, .drop_last = true, .prefetch = 2};
  DataLoader whole(ds, base);
  std::vector<std::unique_ptr<DataLoader>> shards;
  for (int64_t r = 0; r < 3; ++r) {
    DataLoaderOptions o = base;
    o.shard_rank = r;
    o.shard_count = 3;
    shards.push_back(std::make_unique<DataLoader>(ds, o));
  }
  CHECK(shards[0]->batches_per_epoch() == whole.batches_per_epoch());
  for (int step = 0; step < 16; ++step) {  // over two epochs (7 batches each)
    const Batch w = whole.next_step();
    std::vector<int64_t> joined;
    std::vector<int64_t> sizes;
    for (auto& s : shards) {
      const Batch b = s->next_step();
      CHECK(b.position == w.position);
      sizes.push_back(b.size());
      for (int64_t t : targets(b)) joined.push_back(t);
    }
    CHECK(sizes == std::vector<int64_t>{2, 2, 3});  // rows [7r/3, 7(r+1)/3)
    CHECK(joined == targets(w));
  }
  // A shard resumed at a saved position yields what it would have.
  const LoaderPosition p = shards[1]->position();
  const Batch next = shards[1]->next_step();
  DataLoaderOptions o = base;
  o.shard_rank = 1;
  o.shard_count = 3;
  DataLoader resumed(ds, o);
  resumed.set_position(p);
  CHECK(targets(resumed.next_step()) == targets(next));
  CHECK(resumed.batch_indices(p) == targets(next));  // example i has target i
  // Bad shards.
  o.shard_rank = 3;
  CHECK_THROWS_WITH(DataLoader(ds, o), Contains("shard 3 of 3 does not exist"));
  o.shard_rank = 0;
  o.shard_count = 8;
  CHECK_THROWS_WITH(DataLoader(ds, o), Contains("a batch of 7 cannot give each of 8 shards a row"));
}
