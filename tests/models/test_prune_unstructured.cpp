// Unstructured magnitude pruning (models/compress/magnitude_prune.h) and the bitmask sparse
// format (sparse_format.h): the smallest weights go (per layer or globally), the masks keep them
// at zero through optimizer steps and their bytes are in the allocator, and 80% sparse weights
// are stored >= 3x smaller and read back exactly.
#include <catch2/catch.hpp>

#include <filesystem>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/safetensors.h"
#include "models/compress/magnitude_prune.h"
#include "models/compress/sparse_format.h"
#include "models/gpt.h"
#include "models/mobilenet_v2.h"
#include "optim/optim.h"
#include "test_helpers.h"

using namespace mg;

namespace {

GPTConfig tiny_gpt() { return {.vocab_size = 32, .context = 16, .n_layer = 2, .n_head = 4, .d_model = 32}; }

int64_t zeros_in(const Tensor& t) {
  int64_t z = 0;
  for (double v : t.to_double_vector()) z += v == 0.0;
  return z;
}

std::string temp_file(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

}  // namespace

TEST_CASE("prune: magnitude masks remove the smallest weights, per layer or globally", "[prune]") {
  GPT model(tiny_gpt());
  std::map<std::string, std::vector<double>> before;
  for (auto& [n, w] : prunable_weights(model)) before[n] = w.to_double_vector();
  REQUIRE(before.size() == 8);  // c_attn, c_proj, c_fc, c_proj per block; embeddings are not pruned
  const PruneScope scope = GENERATE(PruneScope::per_layer, PruneScope::global);
  MagnitudeMask mask(model, 0.8, scope);
  int64_t total = 0, pruned = 0;
  double max_pruned = 0.0, min_kept = 1e9;
  for (auto& [n, w] : prunable_weights(model)) {
    const auto after = w.to_double_vector();
    const int64_t z = zeros_in(w);
    if (scope == PruneScope::per_layer) CHECK(z == int64_t(0.8 * double(w.numel())));
    double layer_max_pruned = 0.0, layer_min_kept = 1e9;
    for (size_t i = 0; i < after.size(); ++i) {
      const double m = std::abs(before[n][i]);
      if (after[i] == 0.0) layer_max_pruned = std::max(layer_max_pruned, m);
      else {
        layer_min_kept = std::min(layer_min_kept, m);
        CHECK(after[i] == before[n][i]);  // kept weights are untouched
      }
    }
    CHECK(layer_max_pruned <= layer_min_kept);
    max_pruned = std::max(max_pruned, layer_max_pruned);
    min_kept = std::min(min_kept, layer_min_kept);
    total += w.numel();
    pruned += z;
  }
  if (scope == PruneScope::global) {
    CHECK(pruned == int64_t(0.8 * double(total)));
    CHECK(max_pruned <= min_kept);  // one threshold over every layer
  }
  CHECK(mask.pruned_elements() == pruned);
  CHECK(mask.sparsity() == Approx(0.8).margin(1e-3));
  CHECK_THROWS_WITH(MagnitudeMask(model, 1.0, scope), Catch::Contains("--amount must be in [0, 1)"));
}

TEST_CASE("prune: masks keep pruned weights at zero through optimizer steps, their bytes are counted", "[prune]") {
  const Device dev("cpu:15");
  GPT model(tiny_gpt(), {.device = dev});
  const int64_t other_before = memory_stats(dev).category(MemoryCategory::other).current;
  MagnitudeMask mask(model, 0.5, PruneScope::per_layer);
  int64_t expected = 0, rounded = 0;
  for (auto& [n, w] : prunable_weights(model)) {
    expected += (w.numel() + 7) / 8;
    rounded += ((w.numel() + 7) / 8 + 511) / 512 * 512;
  }
  CHECK(mask.mask_bytes() == expected);
  CHECK(memory_stats(dev).category(MemoryCategory::other).current - other_before == rounded);

  AdamW opt(weight_decay_groups(model.named_parameters(), 1e-2, 0.01));
  opt.add_post_step_hook([&] { mask.apply(); });
  const Tensor idx = from_vector(std::vector<double>{1, 5, 9, 3, 30, 2, 7, 7}, {2, 4}, {.dtype = DType::i64, .device = dev});
  const Tensor tgt = from_vector(std::vector<double>{5, 9, 3, 30, 2, 7, 7, 0}, {2, 4}, {.dtype = DType::i64, .device = dev});
  const auto w0 = prunable_weights(model)[2].second.to_double_vector();
  for (int s = 0; s < 3; ++s) {
    backward(model.loss(idx, tgt));
    opt.step();
    opt.zero_grad();
  }
  const auto w1 = prunable_weights(model)[2].second.to_double_vector();
  int64_t changed = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    if (w0[i] == 0.0) CHECK(w1[i] == 0.0);
    changed += w0[i] != 0.0 && w1[i] != w0[i];
  }
  CHECK(changed > int64_t(w0.size()) / 4);  // the kept weights trained
  CHECK(mask.sparsity() == Approx(0.5).margin(1e-3));

  // Masks saved and read back reproduce the same zeros on a fresh model.
  GPT fresh(tiny_gpt(), {.device = dev});
  MagnitudeMask again(fresh, mask.masks_state());
  for (size_t k = 0; k < 8; ++k)  // random weights are nonzero exactly where the mask says
    CHECK(nonzero_bits(prunable_weights(fresh)[k].second).to_double_vector() ==
          mask.masks_state()[k].second.to_double_vector());
  CHECK_THROWS_WITH(MagnitudeMask(fresh, NamedTensors{}), Catch::Contains("0 masks for a model with 8"));
}

TEST_CASE("prune: bitmask sparse safetensors round trip, >= 3x fewer bytes at 80% sparsity", "[prune]") {
  MobileNetV2 model({.width_mult = 0.5, .num_classes = 10, .small_input = true, .input_size = 16});
  MagnitudeMask mask(model, 0.8, PruneScope::global);
  const DType dtype = GENERATE(DType::f32, DType::bf16);
  NamedTensors weights, state;
  for (auto& [n, w] : prunable_weights(model)) weights.emplace_back(n, cast(w, dtype));
  for (auto& [n, t] : model.state_dict()) state.emplace_back(n, t);

  const std::string path = temp_file("mg_prune_sparse.safetensors");
  int64_t dense_bytes = 0;
  for (auto& [n, w] : weights) dense_bytes += int64_t(w.nbytes());
  const int64_t written = save_sparse_safetensors(path, weights);
  INFO("dense " << dense_bytes << " B, sparse " << written << " B");
  CHECK(written * 3 <= dense_bytes);
  CHECK(int64_t(std::filesystem::file_size(path)) * 3 <= dense_bytes);
  int64_t stored = 0;
  const NamedTensors back = load_sparse_safetensors(path, &stored);
  CHECK(stored == written);
  REQUIRE(back.size() == weights.size());
  for (size_t i = 0; i < back.size(); ++i) {
    CHECK(back[i].first == weights[i].first);
    CHECK(back[i].second.dtype() == dtype);
    test::check_close(back[i].second, weights[i].second, 0, 0);
  }
  // A whole state dict (BatchNorm statistics, i64 counters: stored dense) round-trips too.
  save_sparse_safetensors(path, state);
  const NamedTensors all = load_sparse_safetensors(path);
  REQUIRE(all.size() == state.size());
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].first == state[i].first);
    test::check_close(all[i].second, state[i].second, 0, 0);
  }
  std::filesystem::remove(path);
}

TEST_CASE("prune: malformed sparse entries are errors naming the file and entry", "[prune]") {
  const std::string path = temp_file("mg_prune_bad_sparse.safetensors");
  const Tensor w = test::rand_tensor({4, 8}, 1, DType::f32);
  BitmaskSparse s = to_bitmask_sparse(w);
  save_safetensors(path, {{"x.__bits", s.bits}, {"x.__values", s.values}});  // no shape in the metadata
  CHECK_THROWS_WITH(load_sparse_safetensors(path), Catch::Contains("'x' lacks its shape"));
  save_safetensors(path, {{"x.__bits", s.bits}, {"x.__values", narrow(s.values, 0, 0, 5)}}, {{"sparse.x", "4,8"}});
  CHECK_THROWS_WITH(load_sparse_safetensors(path), Catch::Contains("entry 'x'") && Catch::Contains("5 values"));
  std::filesystem::remove(path);
}
