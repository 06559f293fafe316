// Random numbers from a counter-based generator (Philox-4x32-10, Salmon et al. 2011): the
// value at position i of a stream depends only on (seed, offset + i), never on threads or on
// the order numbers are drawn, so a recomputed dropout mask (checkpointing) and a GPU kernel
// reproduce exactly what the CPU drew.
#pragma once
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/half.h"

namespace mg {

// Four 32-bit random words for (key, counter). MG_HOST_DEVICE: shared with CUDA kernels.
MG_HOST_DEVICE std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// Uniform in [0, 1) from 24 random bits.
MG_HOST_DEVICE float uint_to_unit_float(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

class Generator;

// Sees every Generator::advance on this thread while installed (checkpoint records where each
// stream stood when a segment first drew from it, so its recomputation replays the same numbers).
class GeneratorObserver {
 public:
  virtual ~GeneratorObserver() = default;
  virtual void on_advance(Generator& gen, uint64_t offset_before) = 0;
};
// The current observer (nullptr: none); set_generator_observer returns the previous one.
GeneratorObserver* generator_observer();
GeneratorObserver* set_generator_observer(GeneratorObserver* observer);

// A seed and a position in its stream. Drawing n numbers advances the offset by n.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x853c49e6748fea9bULL) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t o) { offset_ = o; }
  // Reserves n consecutive stream positions and returns the first.
  uint64_t advance(uint64_t n) {
    uint64_t o = offset_;
    if (GeneratorObserver* obs = generator_observer()) obs->on_advance(*this, o);
    offset_ += n;
    return o;
  }
  // Uniform [0,1) and standard normal at absolute stream position i (pure functions of seed, i).
  float uniform_at(uint64_t i) const;
  float normal_at(uint64_t i) const;
  uint32_t bits_at(uint64_t i) const;

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator used when none is passed (seeded by mg::manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Where each stream stood when it was first drawn from while the recorder was alive (it chains
// to the observer installed before it, so nested recorders all see every draw). Checkpointing
// replays a segment's draws with it; the Trainer rewinds a step that ran out of memory.
class StreamRecorder : public GeneratorObserver {
 public:
  StreamRecorder();
  ~StreamRecorder() override;
  StreamRecorder(const StreamRecorder&) = delete;
  StreamRecorder& operator=(const StreamRecorder&) = delete;
  void on_advance(Generator& gen, uint64_t offset_before) override;
  using Starts = std::vector<std::pair<Generator*, uint64_t>>;
  const Starts& starts() const { return starts_; }
  // Puts every recorded stream back where it stood at its first draw.
  void rewind() const;

 private:
  GeneratorObserver* prev_;
  Starts starts_;
};

}  // namespace mg
