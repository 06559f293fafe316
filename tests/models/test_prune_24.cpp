// 2:4 semi-structured sparsity (models/compress/sparse_24.h): pruning keeps the 2 largest |w| of
// every group of 4; the compressed layout (values + 2-bit indices) reads back bit for bit, also
// through safetensors, at 2 + 1/8 bytes per f32 element; masks cover GPT's Linears and
// MobileNetV2's 1x1 convs (not its depthwise ones) and hold through AdamW steps; a GPT whose
// Linears became Sparse24Linear computes the masked dense model's logits; bad input is an error.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/safetensors.h"
#include "models/compress/magnitude_prune.h"
#include "models/compress/quant_convert.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"
#include "models/compress/sparse_linear.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "test_helpers.h"

using namespace mg;
using namespace mg::test;
namespace fs = std::filesystem;

TEST_CASE("prune 2:4: keeps the 2 largest of every 4, round trips through its layout", "[prune][sparse24]") {
  const int64_t cols = GENERATE(4, 12, 64);  // 1, 3 (odd: half a metadata byte) and 16 groups a row
  Tensor w = rand_tensor({5, cols}, 3 + uint64_t(cols), DType::f32);
  const std::vector<double> before = w.to_double_vector();
  prune_24_(w);
  const std::vector<double> after = w.to_double_vector();
  for (int64_t g = 0; g < 5 * cols / 4; ++g) {
    int kept = 0;
    double min_kept = 1e9, max_gone = 0.0;
    for (int i = 0; i < 4; ++i) {
      const double b = std::abs(before[size_t(g * 4 + i)]), a = after[size_t(g * 4 + i)];
      if (a != 0.0) {
        ++kept;
        min_kept = std::min(min_kept, b);
        CHECK(a == before[size_t(g * 4 + i)]);
      } else {
        max_gone = std::max(max_gone, b);
      }
    }
    CHECK(kept == 2);
    CHECK(min_kept >= max_gone);
  }
  CHECK(is_24_sparse(w));
  Sparse24 s = to_sparse_24(w);
  CHECK(s.values.shape() == Shape{5, cols / 2});
  CHECK(s.meta.shape() == Shape{5, (cols / 4 + 1) / 2});
  CHECK(s.nbytes() == 5 * cols / 2 * 4 + 5 * ((cols / 4 + 1) / 2));
  CHECK(to_dense(s).to_double_vector() == after);

  // A group with fewer than 2 nonzeros keeps zeros at free indices; still exact.
  Tensor z = zeros({2, 8});
  z.data<float>()[3] = 1.5f;
  z.data<float>()[13] = -2.0f, z.data<float>()[14] = 0.25f;
  CHECK(to_dense(to_sparse_24(z)).to_double_vector() == z.to_double_vector());
}

TEST_CASE("prune 2:4: bad tensors and layouts are clear errors", "[prune][sparse24]") {
  CHECK_FALSE(is_24_sparse(rand_tensor({3, 8}, 1, DType::f32)));  // dense
  CHECK_FALSE(is_24_sparse(rand_tensor({3, 6}, 1, DType::f32)));  // rows of 6
  CHECK_THROWS_WITH(prune_24_(rand_tensor({3, 6}, 1, DType::f32)), Catch::Contains("rows of a multiple of 4"));
  CHECK_THROWS_WITH(prune_24_(rand_tensor({8}, 1, DType::f32)), Catch::Contains(">= 2 dimensions"));
  CHECK_THROWS_WITH(to_sparse_24(rand_tensor({2, 8}, 1, DType::f32)),
                    Catch::Contains("row 0, group 0") && Catch::Contains("not 2:4 sparse"));
  Tensor w = rand_tensor({2, 8}, 2, DType::f32);
  prune_24_(w);
  Sparse24 s = to_sparse_24(w);
  s.meta.data<uint8_t>()[1] = 0x33;  // indices 3 and 0: out of order
  CHECK_THROWS_WITH(to_dense(s), Catch::Contains("row 1, group 0") && Catch::Contains("must increase"));
  s.meta = zeros({2, 2}, {.dtype = DType::u8});
  CHECK_THROWS_WITH(to_dense(s), Catch::Contains("needs 2 u8 metadata bytes, got 4"));
}

TEST_CASE("prune 2:4: safetensors stores the 2:4 layout and reads it back", "[prune][sparse24]") {
  Tensor w = rand_tensor({6, 16}, 5, DType::f32), b = rand_tensor({6}, 6, DType::f32);
  prune_24_(w);
  const std::string path = (fs::temp_directory_path() / "mg_test_sparse24.safetensors").string();
  const int64_t bytes = save_sparse_safetensors(path, {{"fc.weight", w}, {"fc.bias", b}}, SparseLayout::two_four);
  CHECK(bytes == 6 * 8 * 4 + 6 * 2 + 6 * 4);  // values, metadata, the dense bias
  std::vector<std::string> names;
  for (const auto& [name, _] : load_safetensors(path)) names.push_back(name);
  CHECK(std::find(names.begin(), names.end(), "fc.weight.__24values") != names.end());
  CHECK(std::find(names.begin(), names.end(), "fc.weight.__24meta") != names.end());
  int64_t stored = 0;
  const NamedTensors back = load_sparse_safetensors(path, &stored);
  CHECK(stored == bytes);
  REQUIRE(back.size() == 2);
  CHECK(back[0].first == "fc.weight");
  CHECK(back[0].second.to_double_vector() == w.to_double_vector());
  CHECK(back[1].second.to_double_vector() == b.to_double_vector());
  // The metadata tensor missing: a clear error naming the entry.
  save_safetensors(path, {{"fc.weight.__24values", to_sparse_24(w).values}}, {{"sparse24.fc.weight", "6,16"}});
  CHECK_THROWS_WITH(load_sparse_safetensors(path), Catch::Contains("2:4 entry 'fc.weight' lacks its metadata tensor"));
  fs::remove(path);
}

TEST_CASE("prune 2:4: masks cover Linears and 1x1 convs and hold through AdamW steps", "[prune][sparse24]") {
  const Device dev("cpu:14");
  const GPTConfig cfg{.vocab_size = 32, .context = 8, .n_layer = 2, .n_head = 2, .d_model = 16};
  GPT model(cfg, {.device = dev});
  MagnitudeMask mask = MagnitudeMask::two_four(model);
  CHECK(mask.masks_state().size() == 8);  // 2 blocks x 4 Linears
  CHECK(mask.sparsity() == 0.5);
  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.01));
  opt.add_post_step_hook([&] { mask.apply(); });
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7}, {2, 4}, {.dtype = DType::i64, .device = dev});
  const auto w0 = prunable_24_weights(model)[2].second.to_double_vector();
  for (int s = 0; s < 2; ++s) {
    backward(model.loss(idx, idx));
    opt.step();
    opt.zero_grad();
  }
  CHECK(prunable_24_weights(model)[2].second.to_double_vector() != w0);  // the kept weights trained
  for (const auto& [name, w] : prunable_24_weights(model)) CHECK(is_24_sparse(w));
  GPT fresh(cfg, {.device = dev});  // the masks read back onto another model: a subset is fine
  MagnitudeMask again(fresh, mask.masks_state());
  for (const auto& [name, w] : prunable_24_weights(fresh)) CHECK(is_24_sparse(w));

  MobileNetV2 mnv2({.width_mult = 0.5, .num_classes = 10, .small_input = true, .input_size = 16});
  MagnitudeMask m2 = MagnitudeMask::two_four(mnv2);
  int64_t depthwise = 0;
  for (const auto& [name, w] : prunable_weights(mnv2)) {
    const bool in24 = std::any_of(m2.masks_state().begin(), m2.masks_state().end(),
                                  [&name = name](const auto& e) { return e.first == name; });  // clang 14
    if (w.dim() == 4 && w.size(2) == 3) {  // 3x3 (stem, depthwise): not 2:4
      CHECK_FALSE(in24);
      ++depthwise;
    } else {
      CHECK(in24 == shape_fits_24(w));
    }
  }
  CHECK(depthwise > 10);
  for (const auto& [name, w] : prunable_24_weights(mnv2)) CHECK(is_24_sparse(w));
}

TEST_CASE("prune 2:4: Sparse24Linear GPT equals the masked dense model with fewer weight bytes", "[prune][sparse24]") {
  const Device dev("cpu:15");
  const GPTConfig cfg{.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 32};
  GPT model(cfg, {.device = dev});
  { MagnitudeMask mask = MagnitudeMask::two_four(model); }
  model.eval();
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7, 4, 4, 0, 31}, {2, 6},
                                 {.dtype = DType::i64, .device = dev});
  NoGradGuard no_grad;
  const Tensor dense = model.forward(idx);
  const int64_t bytes_before = weight_bytes(model);
  const SparsifyCounts c = sparsify_gpt(model);
  CHECK(c.sparse24 == 8);
  CHECK(c.sparse == 0);
  CHECK(c.dense == 0);
  REQUIRE(dynamic_cast<Sparse24Linear*>(model.h->at<Block>(1)->mlp->c_proj.get()) != nullptr);
  std::string why;
  CHECK(all_close(model.forward(idx).to_double_vector(), dense.to_double_vector(), 1e-4, 1e-5, &why));
  INFO(why);
  // The block Linears' weights: 4 bytes an element before, 2 + 1/8 after.
  const int64_t linear_elems = 2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32);
  CHECK(bytes_before - weight_bytes(model) == linear_elems * 4 - linear_elems / 2 * 4 - linear_elems / 8);
  CHECK_THROWS_WITH(Sparse24Linear::from_float(Linear(8, 4, true, {.device = dev})), Catch::Contains("not 2:4 sparse"));
}
