// Precision names, parameter dtypes and autocast settings (see precision.h).
#include "optim/precision.h"

#include "core/error.h"
#include "models/nn/module.h"

namespace mg {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  if (s == "bf16-pure") return Precision::bf16_pure;
  MG_THROW("unknown precision '", s, "'; expected fp32, bf16, fp16 or bf16-pure");
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::bf16_pure: return "bf16-pure";
  }
  return "?";
}

DType parameter_dtype(Precision p) { return p == Precision::bf16_pure ? DType::bf16 : DType::f32; }

void apply_precision(Module& model, Precision p) {
  if (p == Precision::bf16_pure) model.to(DType::bf16);
}

AutocastState autocast_for(Precision p) {
  return {.enabled = p == Precision::bf16 || p == Precision::fp16,
          .dtype = p == Precision::fp16 ? DType::f16 : DType::bf16};
}

}  // namespace mg
