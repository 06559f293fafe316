// The work counter the planner's cost model reads (core/flop_counter.h): each op reports its
// FLOPs under the kind whose calibrated rate it runs at, every new tensor its elements, on meta
// as on cpu, and only to the innermost counter of the calling thread.
#include <catch2/catch.hpp>

#include <thread>

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
