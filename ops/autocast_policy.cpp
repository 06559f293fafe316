// Autocast's casting rules and floating type promotion (see ops/autocast_policy.h).
#include "ops/autocast_policy.h"

#include "ops/ops.h"

namespace mg {
namespace {

bool is_low(DType t) { return t == DType::f16 || t == DType::bf16; }

// A tensor autocast lowers: floating, not f64 (PyTorch's rule: double stays double), not already
// in the autocast type.
bool lowers(const Tensor& t, DType low) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::f64 && t.dtype() != low;
}

int float_rank(DType t) { return t == DType::f64 ? 3 : t == DType::f32 ? 2 : 1; }

}  // namespace

bool autocast_wants_low(std::initializer_list<Tensor> inputs) {
  const AutocastState s = autocast_state();
  if (!s.enabled) return false;
  for (const Tensor& t : inputs)
    if (lowers(t, s.dtype)) return true;
  return false;
}

Tensor autocast_low(const Tensor& t) {
  const AutocastState s = autocast_state();
  return s.enabled && lowers(t, s.dtype) ? cast(t, s.dtype) : t;
}

bool autocast_wants_f32(std::initializer_list<Tensor> inputs) {
  if (!autocast_state().enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && is_low(t.dtype())) return true;
  return false;
}

Tensor autocast_f32(const Tensor& t) {
  return autocast_state().enabled && t.defined() && is_low(t.dtype()) ? cast(t, DType::f32) : t;
}

bool needs_float_promotion(const Tensor& a, const Tensor& b) {
  // Only under autocast, and never with f64: outside it a dtype mix stays an error (no silent casts).
  return autocast_state().enabled && a.defined() && b.defined() && a.dtype() != b.dtype() &&
         is_floating(a.dtype()) && is_floating(b.dtype()) && a.dtype() != DType::f64 && b.dtype() != DType::f64;
}

std::pair<Tensor, Tensor> promote_floating(const Tensor& a, const Tensor& b) {
  const int ra = float_rank(a.dtype()), rb = float_rank(b.dtype());
  // Two different 16-bit types (f16, bf16) meet in f32, which holds both exactly.
  const DType to = ra > rb ? a.dtype() : rb > ra ? b.dtype() : DType::f32;
  return {cast(a, to), cast(b, to)};
}

}  // namespace mg
