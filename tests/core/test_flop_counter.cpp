// The work counter the planner's cost model reads (core/flop_counter.h): each op reports its
// FLOPs under the kind whose calibrated rate it runs at, every new tensor its elements, on meta
// as on cpu, and only to the innermost counter of the calling thread.
#include <catch2/catch.hpp>

#include <thread>

#include "autograd/engine.h"
#include "core/flop_counter.h"
#include "core/tensor.h"
#include "ops/ops.h"

using namespace mg;

TEST_CASE("flop counter: convolutions report their own kinds and GEMMs theirs", "[core][flops]") {
  const Device meta(DeviceType::meta, 0);
  for (const Device& d : {kCPU, meta}) {
    INFO(d.str());
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO(dtype_name(dt));
      const Tensor x = zeros({2, 8, 4, 4}, {.dtype = dt, .device = d});
      const double pointwise = 2.0 * 2 * 16 * 4 * 4 * 8;  // N * Cout * OH * OW * Cin, 2 per multiply-add
      {
        FlopCounter c;
        (void)conv2d(x, zeros({16, 8, 1, 1}, {.dtype = dt, .device = d}), Tensor(), {});
        CHECK(c.counts().of(conv_kind(dt)) == pointwise);
        CHECK(c.counts().total() == pointwise);
      }
      {
        FlopCounter c;
        (void)conv2d(x, zeros({8, 1, 3, 3}, {.dtype = dt, .device = d}), Tensor(), {.stride = 1, .padding = 1, .groups = 8});
        CHECK(c.counts().of(FlopKind::direct) == 2.0 * 2 * 8 * 4 * 4 * 9);  // depthwise: a direct loop
        CHECK(c.counts().total() == c.counts().of(FlopKind::direct));
      }
      {
        FlopCounter c;
        (void)matmul(zeros({3, 5}, {.dtype = dt, .device = d}), zeros({5, 7}, {.dtype = dt, .device = d}));
        CHECK(c.counts().of(gemm_kind(dt)) == 2.0 * 3 * 5 * 7);
      }
    }
  }
  CHECK(conv_kind(DType::bf16) == FlopKind::conv_16);
  CHECK(conv_kind(DType::f16) == FlopKind::conv_16);
  CHECK(conv_kind(DType::f32) == FlopKind::conv_f32);
  CHECK(flop_kind_name(FlopKind::conv_16) == "conv_16");
}

TEST_CASE("flop counter: a training batch norm reports the elements it normalises, forward and backward", "[core][flops]") {
  const Device meta(DeviceType::meta, 0);
  for (const Device& d : {kCPU, meta}) {
    INFO(d.str());
    const Tensor x = zeros({2, 3, 4, 4}, {.device = d}).set_requires_grad(true);
    const Tensor w = ones({3}, {.device = d}), b = zeros({3}, {.device = d});
    const Tensor rm = zeros({3}, {.device = d}), rv = ones({3}, {.device = d});
    FlopCounter c;
    const Tensor y = batch_norm_relu6(x, rm, rv, w, b, true, 0.1, 1e-5);
    CHECK(c.counts().of(FlopKind::batch_norm) == 2 * 3 * 4 * 4);
    backward(y, ones(y.shape(), {.device = d}));
    CHECK(c.counts().of(FlopKind::batch_norm) == 2 * (2 * 3 * 4 * 4));
    CHECK(c.counts().total() == 0);  // elements, not FLOPs
    (void)batch_norm(x.detach(), rm, rv, w, b, false, 0.1, 1e-5);  // eval: one pass, nothing more
    CHECK(c.counts().of(FlopKind::batch_norm) == 2 * (2 * 3 * 4 * 4));
  }
  CHECK(flop_kind_name(FlopKind::batch_norm) == "batch_norm");
}

TEST_CASE("flop counter: new tensors report their elements whatever their dtype, views none", "[core][flops]") {
  FlopCounter outer;
  {
    FlopCounter inner;  // nested: the innermost counts
    const Tensor a = empty({3, 4});
    const Tensor b = zeros({5}, {.dtype = DType::bf16});
    const Tensor v = narrow(a, 0, 0, 2);  // a view: no new storage
    CHECK(inner.counts().elements == 12 + 5);
  }
  CHECK(outer.counts().elements == 0);
  // Another thread's tensors go to its own counters, not this thread's.
  std::thread([] { (void)empty({100}); }).join();
  CHECK(outer.counts().elements == 0);
  (void)empty({7}, {.device = Device(DeviceType::meta, 0)});
  CHECK(outer.counts().elements == 7);
}

// Note [Reuse distance]: own bytes plus every other tensor touched (created, or released = read
// for the last time) between a tensor's creation and its release, each counted once.
TEST_CASE("flop counter: a tensor's reuse distance counts the tensors written and last read in between", "[core][flops]") {
  FlopCounter c;
  Tensor early = empty({1024});  // 4 KiB
  Tensor a = empty({256});       // 1 KiB
  early = Tensor();              // its last read: 4 KiB + a's 1 KiB = 5 KiB
  Tensor b = empty({768});       // 3 KiB
  a = Tensor();                  // 1 KiB + early's read 4 KiB + b's 3 KiB = 8 KiB
  const FlopCounts n = c.counts();  // b, still alive: 3 KiB + a's read 1 KiB = 4 KiB
  CHECK(reuse_bucket(5 << 10) == 12);
  CHECK(reuse_bucket(8 << 10) == 13);
  CHECK(n.elements_by_reuse[12] == 1024 + 768);
  CHECK(n.elements_by_reuse[13] == 256);  // counting created bytes alone would have put it at 4 KiB
  double filed = 0;
  for (double e : n.elements_by_reuse) filed += e;
  CHECK(filed == n.elements);
  CHECK(reuse_bucket(0) == 0);
  CHECK(reuse_bucket(1e30) == kNumReuseBuckets - 1);
  CHECK(reuse_bucket_bytes(12) > 4096);
  CHECK(reuse_bucket_bytes(12) < 8192);
}

TEST_CASE("flop counter: reuse distances of an op chain are the bytes it allocates, on meta as on cpu", "[core][flops]") {
  for (const Device& d : {kCPU, Device(DeviceType::meta, 0)}) {
    INFO(d.str());
    const Tensor x = zeros({64, 128}, {.device = d});  // made before the counter: not its tensor
    FlopCounter c;
    Tensor y = mul(x, 2.0);          // 32 KiB each
    Tensor z = add(y, 1.0);
    const Tensor w = mul(z, 3.0);
    y = Tensor();                    // y, z, w: 96 KiB
    z = Tensor();                    // z, w, y's read: 96 KiB
    const FlopCounts n = c.counts();  // w, y's and z's reads: 96 KiB
    CHECK(n.elements == 3 * 64 * 128);
    CHECK(n.elements_by_reuse[reuse_bucket(96 << 10)] == 3 * 64 * 128);
  }
}

TEST_CASE("flop counter: a tensor released on another thread is filed by the counter that saw it made", "[core][flops]") {
  FlopCounter c;
  Tensor a = empty({256});  // 1 KiB
  const Tensor b = empty({3 * 256});
  std::thread([t = std::move(a)]() mutable { t = Tensor(); }).join();
  CHECK(c.counts().elements_by_reuse[reuse_bucket(4 << 10)] == 256 + 3 * 256);  // a: 4 KiB; b: 3 + 1 KiB
}
