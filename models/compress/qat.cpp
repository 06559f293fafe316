// The QAT passes and FakeQuantLayer's forward. With observed scales the layer recomputes its
// weight scales every forward (the weights move while training), so what convert_qat's
// quantize_per_channel computes from the final weights is exactly what the last forward used. The
// observer runs on the detached input before the fake quantization, as PyTorch's FakeQuantize does
// (this batch's range already counts), and writes its state back into the layer's buffers.
//
// Note [Learned scales]
// With QatScales::learned the layer owns Parameters weight_scale (Cout) and input_scale (1):
// - weight_scale starts at max|w_c| / 127 of the weights prepare_qat wraps (the trained float model,
//   so what the first forward would observe); input_scale at the observer's scale after the first
//   training batch. The observer then stops, as PyTorch's LSQ recipe turns it off once the scales
//   learn: its range fixes the zero point, which is not learned (input_batches stays 1; minmax and
//   ema agree on one batch, so the observer kind makes no difference here).
// - The forward runs fake_quantize_learned_per_* with LSQ's gradient scale 1 / sqrt(N * Qp): N the
//   elements per scale (a weight channel; the whole input batch), Qp 127 (int8) or 255 (u8).
// - Positive: clamp_scales_ projects them onto [kMinScale, inf) in place before each forward (not
//   in a checkpoint recomputation, which must reproduce the forward) and before convert_qat, so
//   whatever the optimizer's step did, the next use sees a valid scale.
// - Parameters like any other: state_dict, checkpoints and the optimizer carry them (rank 1: the
//   "no_decay" group of weight_decay_groups).
// convert_qat quantizes with weight_scale and input_scale, so the int8 model computes what the
// fake-quant model computed, as with observed scales.
#include "models/compress/qat.h"

#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "core/memory_category.h"
#include "ops/fake_quantize.h"
#include "ops/fake_quantize_learned.h"
#include "ops/ops.h"

namespace mg {

QatScales parse_qat_scales(const std::string& s) {
  if (s == "observed") return QatScales::observed;
  if (s == "learned") return QatScales::learned;
  MG_THROW("unknown QAT scales '", s, "' (known: observed, learned)");
}

const char* qat_scales_name(QatScales s) { return s == QatScales::learned ? "learned" : "observed"; }

FakeQuantLayer::FakeQuantLayer(std::shared_ptr<UnaryModule> in, bool quantize_input, QatOptions opt)
    : ObservedLayer("FakeQuantLayer"), inner(std::move(in)), quantize_input_(quantize_input), opt_(opt) {
  MG_CHECK(inner, "FakeQuantLayer: no layer to wrap");
  conv_ = dynamic_cast<Conv2d*>(inner.get());
  linear_ = inner->type_name() == "Linear" ? dynamic_cast<Linear*>(inner.get()) : nullptr;
  MG_CHECK(conv_ || linear_, "FakeQuantLayer: wraps a Conv2d or a Linear, got a ", inner->type_name());
  MG_CHECK(opt_.observer == ObserverKind::minmax || opt_.observer == ObserverKind::ema,
           "prepare_qat: observer '", observer_kind_name(opt_.observer),
           "' is not supported during training (known: minmax, ema)");
  register_module("inner", inner);
  if (quantize_input_) {
    const Device d = weight_of_inner().device();
    input_lo = register_buffer("input_lo", zeros({1}, {.dtype = DType::f32, .device = d}));
    input_hi = register_buffer("input_hi", zeros({1}, {.dtype = DType::f32, .device = d}));
    input_batches = register_buffer("input_batches", zeros({1}, {.dtype = DType::i64, .device = d}));
  }
  if (opt_.scales == QatScales::learned) {  // Note [Learned scales]
    NoGradGuard ng;
    const Tensor w = weight_of_inner();
    weight_scale = register_parameter("weight_scale", per_channel_scales(w));
    if (quantize_input_)  // set from the observer by the first training forward
      input_scale = register_parameter("input_scale", full({1}, 1.0, {.dtype = DType::f32, .device = w.device()}));
  }
}

void FakeQuantLayer::clamp_scales_() {
  NoGradGuard ng;
  for (const Tensor& s : {weight_scale, input_scale}) {
    if (!s.defined() || s.is_meta()) continue;
    float* p = s.data<float>();  // a Parameter: contiguous
    bool changed = false;
    for (int64_t i = 0; i < s.numel(); ++i)
      if (p[i] < kMinScale) p[i] = kMinScale, changed = true;  // NaN stays, and is the op's error
    if (changed) s.bump_version();
  }
}

Tensor FakeQuantLayer::weight_scales() const {
  return opt_.scales == QatScales::learned ? weight_scale.detach() : Tensor();
}

Tensor FakeQuantLayer::weight_of_inner() const { return conv_ ? conv_->weight : linear_->weight; }

int64_t FakeQuantLayer::observed_batches() const {
  return quantize_input_ && !input_batches.is_meta() ? input_batches.data<int64_t>()[0] : 0;
}

ActivationQParams FakeQuantLayer::input_qparams() const {
  MG_CHECK(quantize_input_, "FakeQuantLayer: this layer's input stays f32 (it has no input quantization)");
  MG_CHECK(observed_batches() > 0, "FakeQuantLayer (", inner->type_name(),
           "): no training forward has been observed, so the input range is unknown\n"
           "  hint: run at least one training step (model.train()) after prepare_qat before evaluating or converting");
  const ActivationQParams observed = choose_qparams_u8(input_lo.data<float>()[0], input_hi.data<float>()[0]);
  if (opt_.scales == QatScales::observed) return observed;
  return {.scale = input_scale.item<float>(), .zero_point = observed.zero_point};
}

Tensor FakeQuantLayer::forward(const Tensor& x) {
  auto scope = forward_scope();
  const bool learned = opt_.scales == QatScales::learned;
  // a checkpoint recomputation must reproduce the forward exactly: nothing moves in it; meta has no data
  const bool may_update = !checkpoint_recomputing() && !x.is_meta();
  if (learned && may_update) clamp_scales_();
  Tensor in = x;
  if (quantize_input_) {
    // the observer moves on training forwards only, once per batch; with learned scales only on the
    // first, which sets input_scale (Note [Learned scales])
    if (is_training() && may_update && (!learned || observed_batches() == 0)) {
      NoGradGuard ng;
      Observer obs({.kind = opt_.observer, .ema_constant = opt_.ema_constant});
      obs.restore(input_lo.data<float>()[0], input_hi.data<float>()[0], observed_batches());
      obs.observe(x.detach());
      fill_(input_lo, obs.lo());
      fill_(input_hi, obs.hi());
      fill_(input_batches, double(obs.batches()));
      if (learned) fill_(input_scale, choose_qparams_u8(obs.lo(), obs.hi()).scale);
    }
    const ActivationQParams q = x.is_meta() ? ActivationQParams{} : input_qparams();
    const double grad_factor = 1.0 / std::sqrt(double(std::max<int64_t>(x.numel(), 1)) * 255.0);
    in = learned ? fake_quantize_learned_per_tensor(x, input_scale, q.zero_point, grad_factor)
                 : fake_quantize_per_tensor(x, q);
  }
  const Tensor w = weight_of_inner();
  Tensor wq;  // (Cout, ...) like w, dw passes straight through
  if (learned) {
    wq = fake_quantize_learned_per_channel(w, weight_scale, 1.0 / std::sqrt(double(w.numel() / w.size(0)) * 127.0));
  } else {
    Tensor scales;
    {
      MemoryCategoryGuard ws(MemoryCategory::workspace);
      scales = per_channel_scales(w);
    }
    wq = fake_quantize_per_channel(w, scales);
  }
  return conv_ ? conv2d(in, wq, conv_->bias, conv_->params) : linear(in, wq, linear_->bias);
}

int64_t prepare_qat(Module& root, QatOptions opt) {
  for (auto& [name, m] : root.named_modules()) {
    MG_CHECK(!dynamic_cast<BatchNorm2d*>(m), "prepare_qat: layer '", name,
             "' is a BatchNorm2d; call fold_batch_norms first (int8 layers take the folded conv)");
    MG_CHECK(!dynamic_cast<ObservedLayer*>(m) && m->type_name().rfind("Int8", 0) != 0, "prepare_qat: layer '", name,
             "' is a ", m->type_name(), "; the model is already prepared or quantized");
  }
  int64_t n = 0;
  for (auto& [name, m] : root.named_modules()) {
    auto* s = dynamic_cast<Sequential*>(m);
    if (!s) continue;
    for (size_t i = 0; i < s->size(); ++i) {
      std::shared_ptr<UnaryModule> layer = (*s)[i];
      const bool conv = dynamic_cast<Conv2d*>(layer.get()) != nullptr;
      const bool linear = dynamic_cast<Linear*>(layer.get()) && layer->type_name() == "Linear";
      if (!conv && !linear) continue;
      auto fq = std::make_shared<FakeQuantLayer>(layer, runs_int8(*layer), opt);
      fq->train(root.is_training());
      s->replace(i, fq);
      ++n;
    }
  }
  MG_CHECK(n > 0, "prepare_qat: the model has no Conv2d or Linear inside a Sequential to train quantized");
  return n;
}

NamedTensors learned_qat_scales(Module& root) {
  NamedTensors out;
  for (auto& [path, m] : root.named_modules()) {
    auto* f = dynamic_cast<FakeQuantLayer*>(m);
    if (f == nullptr || f->scales() != QatScales::learned) continue;
    const std::string prefix = path.empty() ? "" : path + ".";
    out.emplace_back(prefix + "weight_scale", f->weight_scale);
    if (f->input_scale.defined()) out.emplace_back(prefix + "input_scale", f->input_scale);
  }
  return out;
}

ConvertCounts convert_qat(Module& root) {
  bool any = false;
  for (auto& [name, m] : root.named_modules()) any = any || dynamic_cast<FakeQuantLayer*>(m);
  MG_CHECK(any, "convert_qat: the model has no FakeQuantLayer\n  hint: call prepare_qat and train before convert_qat");
  for (auto& [name, m] : root.named_modules())
    if (auto* fq = dynamic_cast<FakeQuantLayer*>(m); fq && fq->scales() == QatScales::learned) fq->clamp_scales_();
  return convert_ptq(root);
}

}  // namespace mg
