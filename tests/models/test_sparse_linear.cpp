// Sparse inference (models/compress/sparse_linear.h): a GPT pruned by magnitude and converted to
// SparseLinear layers computes the same logits as the dense masked model, holds fewer weight bytes
// in the allocator (bitmask + values instead of dense), leaves layers below the threshold dense,
// and refuses training (a gradient through it) and a second conversion with clear errors.
#include <catch2/catch.hpp>

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "models/compress/magnitude_prune.h"
#include "models/compress/quant_convert.h"
#include "models/compress/sparse_linear.h"
#include "models/gpt.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;

TEST_CASE("prune: sparse GPT inference equals the masked dense model with fewer weight bytes", "[prune][sparse]") {
  const Device dev("cpu:13");
  const GPTConfig cfg{.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 32};
  GPT model(cfg, {.device = dev});
  { MagnitudeMask mask(model, 0.8, PruneScope::per_layer); }  // (the mask would keep the dense weights alive)
  model.eval();
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7, 4, 4, 0, 31}, {2, 6},
                                 {.dtype = DType::i64, .device = dev});
  NoGradGuard no_grad;
  const Tensor dense = model.forward(idx);  // (B, T, V)
  const int64_t params_before = memory_stats(dev).category(MemoryCategory::parameter).current;
  const int64_t bytes_before = weight_bytes(model);

  SparsifyCounts c = sparsify_gpt(model, 0.75);
  CHECK(c.sparse == 8);
  CHECK(c.dense == 0);
  auto* fc = dynamic_cast<SparseLinear*>(model.h->at<Block>(0)->mlp->c_fc.get());
  REQUIRE(fc != nullptr);
  CHECK(fc->sparsity() == Approx(0.8).margin(1e-3));
  CHECK_FALSE(fc->weight.defined());  // the dense weight is gone
  const Tensor sparse = model.forward(idx);
  std::string why;
  CHECK(all_close(sparse.to_double_vector(), dense.to_double_vector(), 1e-4, 1e-5, &why));
  INFO(why);
  // The block Linears' dense f32 weights (4 bytes an element) became 1/8 + 0.2 x 4 bytes (plus row offsets).
  int64_t linear_elems = 0;
  for (size_t i = 0; i < 2; ++i) {
    auto b = model.h->at<Block>(i);
    for (Linear* l : {b->attn->c_attn.get(), b->attn->c_proj.get(), b->mlp->c_fc.get(), b->mlp->c_proj.get()})
      linear_elems += l->in_features * l->out_features;
  }
  const int64_t saved = bytes_before - weight_bytes(model);
  CHECK(saved > int64_t(0.7 * 4.0 * double(linear_elems)));
  CHECK(memory_stats(dev).category(MemoryCategory::parameter).current <= params_before - saved + 16 * 512);

  CHECK_THROWS_WITH(sparsify_gpt(model), Catch::Contains("already converted"));
  {
    EnableGradGuard grad;
    CHECK_THROWS_WITH(model.forward(idx), Catch::Contains("inference only"));
  }
  // Below the threshold a layer stays dense.
  GPT other(cfg, {.device = dev});
  MagnitudeMask half(other, 0.5, PruneScope::per_layer);
  c = sparsify_gpt(other, 0.75);
  CHECK(c.sparse == 0);
  CHECK(c.dense == 8);
}
