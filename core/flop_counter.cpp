// The thread-local work counter (see flop_counter.h): FLOPs by kind, and new tensors filed by
// their reuse distance when the allocator releases them.
#include "core/flop_counter.h"

#include <algorithm>
#include <cmath>

namespace mg {

namespace {
thread_local FlopCounter* t_counter = nullptr;
// A Fenwick tree's step: the lowest set bit of k.
size_t lowest_bit(size_t k) { return k & (~k + 1); }
}  // namespace

std::string_view flop_kind_name(FlopKind k) {
  switch (k) {
    case FlopKind::gemm_f32: return "gemm_f32";
    case FlopKind::gemm_16: return "gemm_16";
    case FlopKind::direct: return "direct";
    case FlopKind::conv_f32: return "conv_f32";
    case FlopKind::conv_16: return "conv_16";
    case FlopKind::batch_norm: return "batch_norm";
  }
  return "?";
}

size_t reuse_bucket(double distance_bytes) {
  if (!(distance_bytes >= 1)) return 0;
  return std::min(kNumReuseBuckets - 1, size_t(std::ilogb(distance_bytes)));
}

double reuse_bucket_bytes(size_t bucket) { return std::exp2(double(bucket) + 0.5); }

FlopCounter::FlopCounter() : prev_(t_counter) {
  t_counter = this;
  add_allocator_observer(this);
}

FlopCounter::~FlopCounter() {
  remove_allocator_observer(this);
  t_counter = prev_;
}

size_t FlopCounter::touch(double bytes) {
  const size_t i = touched_bytes_.size();
  if (i + 1 > fenwick_.size()) {  // grow: rebuild the tree over twice the touches
    fenwick_.assign(std::max<size_t>(1024, 2 * fenwick_.size()), 0.0);
    for (size_t j = 0; j < i; ++j)
      for (size_t k = j + 1; k <= fenwick_.size(); k += lowest_bit(k)) fenwick_[k - 1] += touched_bytes_[j];
  }
  touched_bytes_.push_back(0.0);
  add_touched(i, bytes);
  return i;
}

void FlopCounter::add_touched(size_t i, double bytes) {
  touched_bytes_[i] += bytes;
  for (size_t k = i + 1; k <= fenwick_.size(); k += lowest_bit(k)) fenwick_[k - 1] += bytes;
}

double FlopCounter::touched_after(size_t i) const {
  auto prefix = [&](size_t n) {  // touches [0, n)
    double s = 0;
    for (size_t k = n; k > 0; k -= lowest_bit(k)) s += fenwick_[k - 1];
    return s;
  };
  return prefix(touched_bytes_.size()) - prefix(i + 1);
}

FlopCounts FlopCounter::counts() const {
  std::lock_guard<std::mutex> lk(mu_);
  FlopCounts c = counts_;
  for (const auto& [key, t] : live_) c.elements_by_reuse[reuse_bucket(distance(t))] += t.elements;
  return c;
}

// Called by the allocator, on the thread that allocates or frees: a counted tensor's release is
// its last read, which files its elements at its distance and touches its bytes again.
void FlopCounter::on_event(const MemoryEvent& e) {
  if (e.kind != MemoryEvent::Kind::free) return;
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = live_.find({e.device.type, e.device.index, e.block_id});
  if (it == live_.end()) return;
  const LiveTensor& t = it->second;
  counts_.elements_by_reuse[reuse_bucket(distance(t))] += t.elements;
  add_touched(t.touched_at, -t.bytes);
  touch(t.bytes);
  live_.erase(it);
}

void count_flops(FlopKind kind, double flops) {
  if (t_counter) t_counter->counts_.flops[size_t(kind)] += flops;
}

void count_elements(int64_t n, size_t bytes, Device device, uint64_t block_id) {
  FlopCounter* c = t_counter;
  if (!c) return;
  std::lock_guard<std::mutex> lk(c->mu_);
  c->counts_.elements += double(n);
  if (block_id == 0) return;  // an empty tensor: nothing to read again
  c->live_[{device.type, device.index, block_id}] = {
      .touched_at = c->touch(double(bytes)), .bytes = double(bytes), .elements = double(n)};
}

FlopKind gemm_kind(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? FlopKind::gemm_16 : FlopKind::gemm_f32;
}

FlopKind conv_kind(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? FlopKind::conv_16 : FlopKind::conv_f32;
}

}  // namespace mg
