// Post-training quantization passes over a model's module tree:
// 1. fold_batch_norms: every Conv2d followed by a BatchNorm2d in a Sequential (or in MobileNetV2's
//    ConvBNReLU6 unit, which becomes a Sequential) becomes one Conv2d
//    with bias (eval statistics: w' = w * g / sqrt(v + eps), b' = (b - mean) * g / sqrt(v + eps) + beta).
// 2. prepare_ptq: each 1x1 conv and each Linear in a Sequential is wrapped in a CalibrationProbe
//    whose observer records the layer's input range while the caller runs calibration batches.
// 3. convert_ptq: probes (and QAT's fake-quant layers, models/compress/qat.h) become Int8Conv2d,
//    Int8DepthwiseConv2d or Int8Linear (a following ReLU6 fused into the clamp), every other
//    Conv2d becomes Int8WeightOnlyConv2d; then link_int8_chains lets each int8 conv followed
//    directly by another write u8 in that one's input quantization.
// GPT: quantize_gpt_weight_only swaps every Linear of every block for an Int8WeightOnlyLinear.
#pragma once
#include <cstdint>
#include <memory>

#include "models/compress/quant_modules.h"
#include "models/compress/quant_observer.h"
#include "models/gpt.h"

namespace mg {

// A float layer wrapped by a pass that observes it (a PTQ calibration probe, a QAT fake-quant
// layer, models/compress/qat.h): convert_ptq swaps the wrapper for the int8 layer of float_layer(),
// with input_qparams() as its activation quantization when takes_int8_input(), its weights
// quantized with weight_scales().
class ObservedLayer : public UnaryModule {
 public:
  using UnaryModule::UnaryModule;
  virtual std::shared_ptr<UnaryModule> float_layer() const = 0;
  virtual bool takes_int8_input() const = 0;
  virtual int64_t observed_batches() const = 0;
  virtual ActivationQParams input_qparams() const = 0;
  // (Cout) f32: the per-channel weight scales QAT learned; undefined (the default): max|w_c| / 127.
  virtual Tensor weight_scales() const { return {}; }
};

// Whether convert_ptq makes `layer` full int8 (its input quantized): a 1x1 stride-1 ungrouped
// Conv2d or a plain Linear (int8 GEMM), a depthwise Conv2d (int8 depthwise kernel). Every other
// Conv2d becomes int8 weight-only.
bool runs_int8(const UnaryModule& layer);

// Runs the observer over x, then the wrapped layer.
class CalibrationProbe : public ObservedLayer {
 public:
  CalibrationProbe(std::shared_ptr<UnaryModule> inner, ObserverOptions opt);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<UnaryModule> float_layer() const override { return inner; }
  bool takes_int8_input() const override { return true; }
  int64_t observed_batches() const override { return observer.batches(); }
  ActivationQParams input_qparams() const override { return observer.qparams(); }
  std::shared_ptr<UnaryModule> inner;
  Observer observer;
};

// Returns how many BatchNorms were folded. The model should be in eval mode afterwards (the
// folded BatchNorms are gone, so training would no longer normalise).
int64_t fold_batch_norms(Module& root);
// Returns how many layers got a probe.
int64_t prepare_ptq(Module& root, ObserverOptions opt);
// Every probe must have seen at least one batch (else an error naming the layer).
struct ConvertCounts {
  int64_t int8 = 0, weight_only = 0, fused_relu6 = 0, linked = 0;
};
ConvertCounts convert_ptq(Module& root);
// The structure of convert_ptq without calibration (input quantization left at scale 1, zero 0):
// what a quantized file is loaded into (quant_format.h), applied after fold_batch_norms.
ConvertCounts convert_ptq_structure(Module& root);

// Links every int8 conv to the int8 conv that follows it directly in a Sequential (nested
// Sequentials opened, absorbed layers skipped), so it writes u8 in that layer's input quantization;
// returns how many links were made (convert_ptq calls it).
int64_t link_int8_chains(Module& root);

// Returns how many Linears were quantized. The embeddings (and the tied output projection) stay f32.
int64_t quantize_gpt_weight_only(GPT& model);

// Bytes of every parameter and buffer (deduplicated storages): a model's weight bytes.
int64_t weight_bytes(const Module& m);

}  // namespace mg
