// Caching allocator: rounding, reuse, split/coalesce, categories, peaks, budgets and their
// error message, recovery after OOM, and that reserved bytes match the process's resident memory.
#include <catch2/catch.hpp>
#include <fstream>
#include <vector>
#include <string>

#include "core/allocator.h"
#include "core/tensor.h"

using namespace mg;

namespace {
// A device index no other test uses, so statistics start clean.
Device fresh_cpu(int i) { return Device(DeviceType::cpu, i); }

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}
}  // namespace

TEST_CASE("allocator rounds to 512 bytes and reuses a freed block", "[allocator]") {
  CachingAllocator& a = allocator_for(fresh_cpu(3));
  a.empty_cache();
  MemoryBlock* b1 = a.allocate(100);
  CHECK(b1->size == 512);
  char* p = b1->ptr;
  a.free(b1);
  MemoryBlock* b2 = a.allocate(300);
  CHECK(b2->ptr == p);  // same memory, from the cache
  auto s = a.stats();
  CHECK(s.num_segment_allocs == 1);
  CHECK(s.allocated.current == 512);
  a.free(b2);
  CHECK(a.stats().allocated.current == 0);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

TEST_CASE("allocator splits blocks and coalesces neighbours on free", "[allocator]") {
  CachingAllocator& a = allocator_for(fresh_cpu(4));
  MemoryBlock* x = a.allocate(4 << 20);  // 4 MiB from a 20 MiB segment
  MemoryBlock* y = a.allocate(4 << 20);
  MemoryBlock* z = a.allocate(4 << 20);
  CHECK(y->ptr == x->ptr + (4 << 20));
  CHECK(z->ptr == y->ptr + (4 << 20));
  CHECK(a.stats().reserved.current == 20 << 20);
  a.free(x);
  a.free(z);
  a.free(y);  // merges with both neighbours
  // A freed large block is reused whole: a 20 MiB request needs no new segment.
  MemoryBlock* big = a.allocate(20 << 20);
  CHECK(big->ptr == x->ptr);
  CHECK(a.stats().num_segment_allocs == 1);
  a.free(big);
  a.empty_cache();
}

TEST_CASE("allocator statistics by category and peak reset", "[allocator]") {
  Device d = fresh_cpu(5);
  reset_peak_stats(d);
  {
    MemoryCategoryGuard g(MemoryCategory::parameter);
    Tensor w = zeros({256, 256}, {.device = d});
    CHECK(memory_stats(d).category(MemoryCategory::parameter).current == 256 * 256 * 4);
    {
      MemoryCategoryGuard g2(MemoryCategory::optimizer_state);
      Tensor m = zeros({128}, {.device = d});
      CHECK(memory_stats(d).category(MemoryCategory::optimizer_state).current == 512);
    }
    CHECK(memory_stats(d).category(MemoryCategory::optimizer_state).current == 0);
    CHECK(memory_stats(d).category(MemoryCategory::optimizer_state).peak == 512);
  }
  CHECK(memory_stats(d).allocated.current == 0);
  CHECK(memory_stats(d).allocated.peak == 256 * 256 * 4 + 512);
  reset_peak_stats(d);
  CHECK(memory_stats(d).allocated.peak == 0);
  CHECK(memory_stats(d).category(MemoryCategory::parameter).peak == 0);
}

TEST_CASE("budget: OutOfMemoryError explains itself and nothing leaks", "[allocator]") {
  Device d = fresh_cpu(6);
  empty_cache(d);
  set_memory_limit(d, 8 << 20);
  Tensor keep;
  {
    MemoryCategoryGuard g(MemoryCategory::parameter);
    OpNameGuard op("make_weights");
    keep = empty({1 << 20}, {.device = d});  // 4 MiB
  }
  int64_t before = memory_stats(d).allocated.current;
  try {
    OpNameGuard op("matmul");
    Tensor t = empty({2 << 20}, {.device = d});  // 8 MiB: over the budget
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    std::string m = e.what();
    CHECK(m.find("cpu:6") != std::string::npos);
    CHECK(m.find("8.00 MiB") != std::string::npos);       // what was asked, and the limit
    CHECK(m.find("by op 'matmul'") != std::string::npos);  // which op asked
    CHECK(m.find("parameter 4.00 MiB") != std::string::npos);
    CHECK(m.find("make_weights") != std::string::npos);  // the largest live tensor's op
    CHECK(m.find("hint:") != std::string::npos);
  }
  CHECK(memory_stats(d).allocated.current == before);  // nothing leaked
  CHECK(memory_stats(d).num_ooms == 1);
  // The process keeps working: a request that fits succeeds.
  Tensor ok = zeros({1 << 19}, {.device = d});
  CHECK(ok.numel() == 1 << 19);
  keep = Tensor();
  ok = Tensor();
  set_memory_limit(d, 0);
  empty_cache(d);
}

TEST_CASE("budget: the out-of-memory hint names only existing techniques, each with its flag", "[allocator]") {
  Device d = fresh_cpu(19);
  const std::vector<std::pair<MemoryCategory, std::vector<std::string>>> expected = {
      {MemoryCategory::activation,
       {"activations dominate", "--checkpoint blocks", "--micro-batch N", "--auto-fit", "--precision bf16",
        "--offload-activations cpu:1"}},
      {MemoryCategory::parameter, {"parameters dominate", "--precision bf16-pure"}},
      {MemoryCategory::optimizer_state, {"optimizer state dominates", "--optimizer sgd"}},
      {MemoryCategory::gradient, {"gradients dominate", "--precision bf16-pure"}},
      {MemoryCategory::input, {"input batches dominate", "--batch"}},
      {MemoryCategory::other, {"--batch", "--checkpoint blocks", "--precision bf16"}},
  };
  for (const auto& [category, phrases] : expected) {
    INFO(category_name(category));
    empty_cache(d);
    set_memory_limit(d, 8 << 20);
    Tensor keep;
    {
      MemoryCategoryGuard g(category);
      keep = empty({1 << 20}, {.device = d});  // 4 MiB: the largest category
    }
    std::string hint;
    try {
      Tensor t = empty({2 << 20}, {.device = d});  // 8 MiB: over the budget
      FAIL("expected OutOfMemoryError");
    } catch (const OutOfMemoryError& e) {
      std::string m = e.what();
      REQUIRE(m.find("hint: ") != std::string::npos);
      hint = m.substr(m.find("hint: "));
    }
    for (const std::string& p : phrases) CHECK_THAT(hint, Catch::Contains(p));
    for (const char* absent : {"prun", "INT8", "shard", "split", "momentum"})
      CHECK_THAT(hint, !Catch::Contains(absent, Catch::CaseSensitive::No));
    keep = Tensor();
    set_memory_limit(d, 0);
    empty_cache(d);
  }
}

TEST_CASE("budget: cached blocks are released and retried before failing", "[allocator]") {
  Device d = fresh_cpu(7);
  empty_cache(d);
  set_memory_limit(d, 24 << 20);
  { Tensor a = empty({3 << 20}, {.device = d}); }  // 12 MiB, freed into a 20 MiB cached segment
  // 16 MiB does not fit in the cached 20 MiB segment next to... it does: but a 22 MiB one needs
  // the cached segment returned first.
  Tensor b = empty({(22 << 20) / 4}, {.device = d});
  CHECK(memory_stats(d).reserved.current <= 24 << 20);
  b = Tensor();
  set_memory_limit(d, 0);
  empty_cache(d);
}

TEST_CASE("reserved bytes match the growth of resident memory", "[allocator]") {
  Device d = fresh_cpu(8);
  empty_cache(d);
  int64_t rss0 = rss_bytes();
  std::vector<Tensor> ts;
  for (int i = 0; i < 8; ++i) ts.push_back(full({16 << 20}, 1.0, {.device = d}));  // 8 x 64 MiB, written
  int64_t grew = rss_bytes() - rss0;
  int64_t reserved = memory_stats(d).reserved.current;
  CHECK(reserved == 8 * (64 << 20));
  CHECK(std::abs(double(grew - reserved)) <= 0.10 * double(reserved));
  ts.clear();
  empty_cache(d);
  CHECK(memory_stats(d).reserved.current == 0);
}

TEST_CASE("meta device allocates bytes but no memory", "[allocator]") {
  int64_t rss0 = rss_bytes();
  Tensor t = empty({1 << 28}, {.device = kMeta});  // 1 GiB
  CHECK(memory_stats(kMeta).allocated.current >= int64_t(1) << 30);
  CHECK(rss_bytes() - rss0 < (64 << 20));
  CHECK_THROWS_WITH(t.data_ptr(), Catch::Contains("meta"));
}

TEST_CASE("parse and format byte sizes", "[allocator]") {
  CHECK(parse_bytes("512MiB") == size_t(512) << 20);
  CHECK(parse_bytes("2GB") == size_t(2000000000));
  CHECK(parse_bytes("1.5GiB") == size_t(1536) << 20);
  CHECK(parse_bytes("1000") == 1000);
  CHECK_THROWS_WITH(parse_bytes("12 parsecs"), Catch::Contains("unknown unit"));
  CHECK_THROWS_WITH(parse_bytes("lots"), Catch::Contains("bad memory size"));
  CHECK(format_bytes(1536) == "1.50 KiB");
}
