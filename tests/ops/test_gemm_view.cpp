// ops/gemm_view.h, the layout rules shared by the CPU and cuBLAS matmuls: which strided views go
// to a GEMM without a copy (and with which leading dimension), broadcast batch strides, and when
// a batched product is one flat GEMM or one strided-batched GEMM.
#include <catch2/catch.hpp>

#include "ops/gemm_view.h"
#include "ops/ops.h"

using namespace mg;
using namespace mg::gemm;

TEST_CASE("gemm view: row-major, transposed, padded and copy-needing layouts", "[gemm_view]") {
  auto v = gemm_view(3, 4, 4, 1);  // contiguous (3, 4)
  REQUIRE(v);
  CHECK_FALSE(v->trans);
  CHECK(v->ld == 4);
  v = gemm_view(3, 4, 1, 3);  // the transpose of a contiguous (4, 3)
  REQUIRE(v);
  CHECK(v->trans);
  CHECK(v->ld == 3);
  v = gemm_view(3, 4, 8, 1);  // rows padded to 8
  REQUIRE(v);
  CHECK(v->ld == 8);
  CHECK_FALSE(gemm_view(3, 4, 8, 2));  // no unit stride: the caller copies
  CHECK_FALSE(gemm_view(3, 4, 2, 1));  // rows overlap: not a GEMM operand
  v = gemm_view(1, 5, 0, 1);            // a single row: any row stride, ld = cols
  REQUIRE(v);
  CHECK(v->ld == 5);
}

TEST_CASE("gemm view: batch strides broadcast, offsets, flat and linear batches", "[gemm_view]") {
  Tensor a = zeros({2, 3, 4, 5});  // batch (2, 3)
  Tensor b = zeros({3, 5, 6});     // batch (3), broadcast over the leading 2
  Shape batch{2, 3};
  CHECK(batch_strides(a, batch) == Shape{60, 20});
  CHECK(batch_strides(b, batch) == Shape{0, 30});
  CHECK(batch_offset(4, batch, Shape{60, 20}) == 60 + 20);  // i = 4 is (1, 1)
  CHECK(batch_offset(4, batch, Shape{0, 30}) == 30);
  // a contiguous: rows spaced by 5 across every batch, so one (24, 5) GEMM when b is shared.
  auto va = gemm_view(4, 5, 5, 1);
  REQUIRE(va);
  CHECK(flat_row_stride(batch, Shape{60, 20}, 4, 5, *va) == 5);
  CHECK_FALSE(flat_row_stride(batch, Shape{80, 20}, 4, 5, *va));  // a gap between outer batches
  CHECK(linear_batch_stride(batch, Shape{60, 20}) == 20);
  CHECK_FALSE(linear_batch_stride(batch, Shape{0, 30}));  // broadcast in the outer dim
  CHECK(linear_batch_stride(Shape{1, 1}, Shape{0, 0}) == 0);
}
