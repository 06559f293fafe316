// Quantization-aware training (Jacob et al. 2018, "Quantization and Training of Neural Networks
// for Efficient Integer-Arithmetic-Only Inference"; PyTorch's prepare_qat / convert). PTQ rounds
// a trained model once and hopes; QAT fine-tunes the model while its forward already sees the
// rounding, so the weights move to where rounding hurts least. Three steps:
// 1. fold_batch_norms (quant_convert.h), then prepare_qat: every Conv2d and Linear that
//    convert_ptq will quantize is wrapped in a FakeQuantLayer. Its weight passes through
//    fake_quantize_per_channel (symmetric, scale max|w_c| / 127 from the current weights) and,
//    for the layers that run full int8 (1x1 and depthwise convs, Linears), its input through
//    fake_quantize_per_tensor with the u8 parameters of an observer (ema by default) that moves
//    with every training forward. Backward is the straight-through estimator (ops/fake_quantize.h).
// 2. Train as usual (Trainer, autocast, checkpointing, accumulation; the observer is frozen in
//    eval mode and during checkpoint recomputation, and its state is in buffers, so checkpoints
//    and auto-fit retries carry it).
// 3. convert_qat: the same int8 model convert_ptq makes, with the observed input ranges.
// The converted model computes what the fake-quant model computed, up to f32 summation order.
// With QatScales::learned (LSQ, Esser et al. 2019) the scales are Parameters the optimizer trains
// through ops/fake_quantize_learned.h instead: see Note [Learned scales] in qat.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "models/compress/quant_convert.h"

namespace mg {

// observed: weight scales max|w_c| / 127 of the current weights, input scales from the observer,
// both recomputed every forward. learned: both start there and are then trained (LSQ).
enum class QatScales { observed, learned };
// "observed", "learned"; throws listing the names.
QatScales parse_qat_scales(const std::string& s);
const char* qat_scales_name(QatScales s);

struct QatOptions {
  ObserverKind observer = ObserverKind::ema;  // minmax or ema
  double ema_constant = 0.01;
  QatScales scales = QatScales::observed;
};

// A Conv2d or Linear trained with fake-quantized weights (and input when takes_int8_input()).
class FakeQuantLayer : public ObservedLayer {
 public:
  FakeQuantLayer(std::shared_ptr<UnaryModule> inner, bool quantize_input, QatOptions opt);
  // x: the inner layer's input -> its output.
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<UnaryModule> float_layer() const override { return inner; }
  bool takes_int8_input() const override { return quantize_input_; }
  int64_t observed_batches() const override;
  // Throws (naming the layer type) when no training forward has been observed yet. Learned: the
  // learned input scale with the observer's zero point.
  ActivationQParams input_qparams() const override;
  // Learned: weight_scale (detached); observed: undefined (max|w_c| / 127, what the forward used).
  Tensor weight_scales() const override;
  QatScales scales() const { return opt_.scales; }

  std::shared_ptr<UnaryModule> inner;  // the Conv2d or Linear, its parameters trained as usual
  // The observer's state as buffers: (1) f32 range, (1) i64 training forwards seen (input layers only).
  Tensor input_lo, input_hi, input_batches;
  // Learned only: Parameters (Cout) f32 and, for input layers, (1) f32; undefined when observed.
  Tensor weight_scale, input_scale;

  // Learned: clamps both scales to kMinScale in place where an entry fell below it (the optimizer's
  // step may take one there); writes, and bumps their versions, only when something changed.
  void clamp_scales_();
  static constexpr float kMinScale = 1.1920929e-7f;  // float epsilon, PyTorch _LearnableFakeQuantize's

 private:
  Tensor weight_of_inner() const;
  bool quantize_input_;
  QatOptions opt_;
  Conv2d* conv_ = nullptr;
  Linear* linear_ = nullptr;
};

// Wraps every Conv2d and plain Linear inside a Sequential; returns how many. Call after
// fold_batch_norms (a BatchNorm2d left is an error) on a float model (an already prepared or
// quantized one is an error).
int64_t prepare_qat(Module& root, QatOptions opt = {});
// The learned scales (weight_scale, input_scale of every learned FakeQuantLayer) by their names in
// root.named_parameters(); empty for observed scales. An optimizer gives them a group of their own.
NamedTensors learned_qat_scales(Module& root);
// Every FakeQuantLayer -> its int8 layer (convert_ptq's rules; learned scales clamped as a forward
// would first); the model should be in eval mode.
// Throws when the model has no FakeQuantLayer or one that saw no training batch.
ConvertCounts convert_qat(Module& root);

}  // namespace mg
