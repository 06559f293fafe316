// Precision: the numeric formats a training run computes in, and what each means for the model,
// the forward pass and the optimizer. One place maps a Precision to its parameter dtype and its
// autocast, so the Trainer, evaluation and sampling never spell the mapping out again.
#pragma once
#include <string>

#include "autograd/autocast.h"
#include "core/dtype.h"

namespace mg {

class Module;

// fp32; bf16 / fp16 autocast (f32 parameters, GEMM-shaped ops in 16 bits; fp16 with loss
// scaling); bf16-pure (parameters and activations in bf16, f32 master weights and state in the
// optimizer: convert the model with apply_precision before building the optimizer).
enum class Precision { fp32, bf16, fp16, bf16_pure };

// "fp32", "bf16", "fp16", "bf16-pure"; anything else is an error naming the value.
Precision parse_precision(const std::string& s);
std::string precision_name(Precision p);
// The dtype a model's floating parameters and inputs have under p (bf16 for bf16-pure, else f32).
DType parameter_dtype(Precision p);
// Casts every floating parameter and buffer of `model` to parameter_dtype(p) (no-op otherwise).
void apply_precision(Module& model, Precision p);
// The autocast forward passes run under: on in f16 / bf16 for fp16 / bf16, off otherwise
// (bf16-pure needs none: its parameters and inputs are bf16 already).
AutocastState autocast_for(Precision p);

}  // namespace mg
