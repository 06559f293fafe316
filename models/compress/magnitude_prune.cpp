// Magnitude masks (see magnitude_prune.h). The threshold is found with nth_element over a
// scratch copy of the magnitudes held by the allocator (category workspace); ties at the
// threshold are pruned in index order until exactly floor(amount * n) weights are gone.
#include "models/compress/magnitude_prune.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "models/compress/sparse_24.h"
#include "models/compress/sparse_format.h"
#include "models/nn/layers.h"
#include "ops/ops.h"

namespace mg {
namespace {

// |w| of every element of `weights`, one after the other, as f32 in a workspace tensor.
Tensor magnitudes(const NamedTensors& weights) {
  int64_t n = 0;
  for (const auto& [_, w] : weights) n += w.numel();
  MemoryCategoryGuard scratch(MemoryCategory::workspace);
  Tensor out = empty({n}, {.dtype = DType::f32});
  float* o = out.data<float>();
  for (const auto& entry : weights) {
    const Tensor& w = entry.second;  // not a structured binding: clang < 16 cannot capture those
    MG_DISPATCH_FLOAT(w.dtype(), "magnitude prune", [&] {
      const scalar_t* p = w.data<scalar_t>();
      for (int64_t i = 0; i < w.numel(); ++i) *o++ = std::abs(float(p[i]));
    });
  }
  return out;
}

// Zeroes the `remove` smallest magnitudes among `weights` (the entries of `mag`, in that order).
void prune_smallest(const NamedTensors& weights, const Tensor& mag, int64_t remove) {
  if (remove <= 0) return;
  const int64_t n = mag.numel();
  Tensor sorted = [&] {
    MemoryCategoryGuard scratch(MemoryCategory::workspace);
    return clone(mag);
  }();
  float* s = sorted.data<float>();
  std::nth_element(s, s + (remove - 1), s + n);
  const float threshold = s[remove - 1];
  int64_t below = 0;
  const float* m = mag.data<float>();
  for (int64_t i = 0; i < n; ++i) below += m[i] < threshold;
  int64_t ties = remove - below;  // entries equal to the threshold that go too (in index order)
  int64_t i = 0;
  for (const auto& entry : weights) {
    const Tensor& w = entry.second;  // not a structured binding: clang < 16 cannot capture those
    MG_DISPATCH_FLOAT(w.dtype(), "magnitude prune", [&] {
      scalar_t* p = w.data<scalar_t>();
      for (int64_t k = 0; k < w.numel(); ++k, ++i) {
        const bool go = m[i] < threshold || (m[i] == threshold && ties > 0 && ties--);
        if (go) p[k] = scalar_t(0.0f);
      }
    });
    w.bump_version();
  }
}

// Zeroes the smallest |w| of `weights` until floor(amount * n) are zero, per layer or over all.
// Zeros count as the smallest, so weights pruned before stay pruned.
void prune_weights(const NamedTensors& weights, double amount, PruneScope scope) {
  MG_CHECK(amount >= 0.0 && amount < 1.0, "prune: --amount must be in [0, 1) (the fraction of weights removed), got ",
           amount);
  NoGradGuard no_grad;
  if (scope == PruneScope::global) {
    const Tensor mag = magnitudes(weights);
    prune_smallest(weights, mag, int64_t(std::floor(amount * double(mag.numel()))));
  } else {
    for (const auto& w : weights) {
      const NamedTensors one = {w};
      const Tensor mag = magnitudes(one);
      prune_smallest(one, mag, int64_t(std::floor(amount * double(mag.numel()))));
    }
  }
}

}  // namespace

NamedTensors prunable_weights(Module& model) {
  NamedTensors out;
  for (auto& [name, m] : model.named_modules()) {
    const std::string prefix = name.empty() ? "" : name + ".";
    if (auto* l = dynamic_cast<Linear*>(m)) out.emplace_back(prefix + "weight", l->weight);
    else if (auto* c = dynamic_cast<Conv2d*>(m)) out.emplace_back(prefix + "weight", c->weight);
  }
  for (const auto& [name, w] : out)
    MG_CHECK(w.device().is_cpu() && w.is_contiguous(), "magnitude prune: weight '", name, "' is on ",
             w.device().str(), "; prune on the host (cpu) and move the model afterwards");
  return out;
}

MagnitudeMask::MagnitudeMask(Module& model, double amount, PruneScope scope) : weights_(prunable_weights(model)) {
  MG_CHECK(!weights_.empty(), "prune: the model has no Linear or Conv2d weights to prune");
  prune_weights(weights_, amount, scope);
  make_masks();
}

MagnitudeMask MagnitudeMask::two_four(Module& model) {
  MagnitudeMask m;
  m.weights_ = prunable_24_weights(model);
  MG_CHECK(!m.weights_.empty(), "prune: 2:4 needs a Linear or 1x1 Conv2d whose input width is a multiple of 4; the "
           "model has none");
  for (const auto& [_, w] : m.weights_) prune_24_(w);
  m.make_masks();
  return m;
}

void MagnitudeMask::make_masks() {
  // A bit per weight still nonzero (a weight that was exactly zero counts as pruned).
  MemoryCategoryGuard guard(MemoryCategory::other);
  for (const auto& [name, w] : weights_) masks_.emplace_back(name, nonzero_bits(w));
}

void MagnitudeMask::prune_to(double amount, PruneScope scope) {
  apply();  // the masked weights are zero again, so they rank first
  prune_weights(weights_, amount, scope);
  MemoryCategoryGuard scratch(MemoryCategory::workspace);
  for (size_t i = 0; i < weights_.size(); ++i) {
    const Tensor bits = nonzero_bits(weights_[i].second);
    std::memcpy(masks_[i].second.data_ptr(), bits.data_ptr(), bits.nbytes());
  }
}

MagnitudeMask::MagnitudeMask(Module& model, const NamedTensors& masks) {
  const NamedTensors all = prunable_weights(model);
  std::map<std::string, Tensor> by_name(masks.begin(), masks.end());
  MG_CHECK(!by_name.empty(), "prune: 0 masks for a model with ", all.size(), " prunable weights");
  MemoryCategoryGuard guard(MemoryCategory::other);
  for (const auto& [name, w] : all) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // not masked (e.g. a depthwise conv under 2:4)
    MG_CHECK(it->second.dtype() == DType::u8 && it->second.numel() == (w.numel() + 7) / 8, "prune: the mask of '",
             name, "' has ", it->second.numel(), " bytes; its weight ", w.shape(), " needs ", (w.numel() + 7) / 8);
    weights_.emplace_back(name, w);
    masks_.emplace_back(name, it->second.device().is_cpu() ? contiguous(it->second) : to(it->second, kCPU));
    by_name.erase(it);
  }
  MG_CHECK(by_name.empty(), "prune: a mask for '", by_name.empty() ? "" : by_name.begin()->first,
           "', which is not a Linear or Conv2d weight of the model");
  apply();
}

void MagnitudeMask::apply() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < weights_.size(); ++i) apply_bits_(weights_[i].second, masks_[i].second);
}

int64_t MagnitudeMask::mask_bytes() const {
  int64_t b = 0;
  for (const auto& [_, m] : masks_) b += int64_t(m.nbytes());
  return b;
}

int64_t MagnitudeMask::masked_elements() const {
  int64_t n = 0;
  for (const auto& [_, w] : weights_) n += w.numel();
  return n;
}

int64_t MagnitudeMask::pruned_elements() const {
  int64_t kept = 0;
  for (size_t i = 0; i < weights_.size(); ++i) kept += count_bits(masks_[i].second, weights_[i].second.numel());
  return masked_elements() - kept;
}

}  // namespace mg
