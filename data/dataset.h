// Dataset: a random-access collection of (input, target) examples, the interface every data
// source implements (token windows, image folders, Fashion-MNIST) and the DataLoader consumes.
// An example is a pure function of (index, epoch) and the dataset's own seed, so random window
// sampling and augmentation are reproducible and a resumed run sees exactly the same data.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "core/rng.h"
#include "core/tensor.h"

namespace mg {

struct Example {
  Tensor input;   // e.g. (T) i64 tokens, (H, W, C) u8 image, (C, H, W) f32 after to_tensor
  Tensor target;  // e.g. (T) i64 next tokens, () i64 class index; may be undefined
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of examples in one epoch.
  virtual int64_t size() const = 0;
  // Example `index` (0 <= index < size()) of epoch `epoch`. Must be thread-safe: the DataLoader
  // calls it from its prefetch thread while the training loop may read the dataset too.
  // Datasets that draw random numbers key them by (seed, epoch, index), never by call order.
  // Every override keeps the default epoch 0 (default arguments bind statically).
  virtual Example get(int64_t index, int64_t epoch = 0) const = 0;
};

// A seed derived from `seed` and a few integers (splitmix64 over each): how per-epoch and
// per-example random streams are keyed. Different tuples give unrelated seeds.
inline uint64_t derive_seed(uint64_t seed, std::initializer_list<uint64_t> keys) {
  auto mix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(seed);
  for (uint64_t k : keys) h = mix(h ^ mix(k));
  return h;
}

// 64 random bits at stream position i (two 32-bit words of the Philox stream).
inline uint64_t bits64_at(const Generator& g, uint64_t i) {
  return (uint64_t(g.bits_at(2 * i)) << 32) | g.bits_at(2 * i + 1);
}

// A uniform integer in [0, n) from 64 random bits (Lemire's multiply-shift; bias < n / 2^64).
inline uint64_t bounded(uint64_t bits, uint64_t n) {
  return uint64_t((static_cast<unsigned __int128>(bits) * n) >> 64);
}

}  // namespace mg
