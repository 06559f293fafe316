// The thread-local FLOP counter (see flop_counter.h).
#include "core/flop_counter.h"

namespace mg {

namespace {
thread_local FlopCounter* t_counter = nullptr;
}

std::string_view flop_kind_name(FlopKind k) {
  switch (k) {
    case FlopKind::gemm_f32: return "gemm_f32";
    case FlopKind::gemm_16: return "gemm_16";
    case FlopKind::direct: return "direct";
    case FlopKind::conv_f32: return "conv_f32";
    case FlopKind::conv_16: return "conv_16";
  }
  return "?";
}

FlopCounter::FlopCounter() : prev_(t_counter) { t_counter = this; }
FlopCounter::~FlopCounter() { t_counter = prev_; }

void count_flops(FlopKind kind, double flops) {
  if (t_counter) t_counter->counts_.flops[size_t(kind)] += flops;
}

void count_elements(int64_t n) {
  if (t_counter) t_counter->counts_.elements += double(n);
}

FlopKind gemm_kind(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? FlopKind::gemm_16 : FlopKind::gemm_f32;
}

FlopKind conv_kind(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? FlopKind::conv_16 : FlopKind::conv_f32;
}

}  // namespace mg
