// Generator: stream positions mapped onto Philox blocks (4 words per counter value).
#include "core/rng.h"

#include "core/generator_scope.h"

#include <cmath>

namespace mg {

uint32_t Generator::bits_at(uint64_t i) const { return philox4x32(seed_, 0, i >> 2)[i & 3]; }

float Generator::uniform_at(uint64_t i) const { return uint_to_unit_float(bits_at(i)); }

float Generator::normal_at(uint64_t i) const {
  // Box-Muller on the pair of words of a second counter space (counter_hi = 1) at position i.
  auto w = philox4x32(seed_, 1, i >> 1);
  uint32_t a = (i & 1) ? w[2] : w[0];
  uint32_t b = (i & 1) ? w[3] : w[1];
  float u1 = (float(a >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = uint_to_unit_float(b);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
}

namespace {
thread_local Generator* t_default_generator = nullptr;  // DefaultGeneratorScope's stand-in
}  // namespace

Generator* thread_default_generator() { return t_default_generator; }

DefaultGeneratorScope::DefaultGeneratorScope(Generator& gen) : prev_(t_default_generator) { t_default_generator = &gen; }
DefaultGeneratorScope::~DefaultGeneratorScope() { t_default_generator = prev_; }

Generator& default_generator() {
  if (t_default_generator) return *t_default_generator;
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {
thread_local GeneratorObserver* t_generator_observer = nullptr;
}  // namespace

GeneratorObserver* generator_observer() { return t_generator_observer; }
GeneratorObserver* set_generator_observer(GeneratorObserver* observer) {
  GeneratorObserver* prev = t_generator_observer;
  t_generator_observer = observer;
  return prev;
}

StreamRecorder::StreamRecorder() : prev_(set_generator_observer(this)) {}
StreamRecorder::~StreamRecorder() { set_generator_observer(prev_); }

void StreamRecorder::on_advance(Generator& gen, uint64_t offset_before) {
  bool seen = false;
  for (const auto& s : starts_) seen = seen || s.first == &gen;
  if (!seen) starts_.emplace_back(&gen, offset_before);
  if (prev_) prev_->on_advance(gen, offset_before);
}

void StreamRecorder::rewind() const {
  for (const auto& [gen, offset] : starts_) gen->set_offset(offset);
}

}  // namespace mg
