// The QAT passes and FakeQuantLayer's forward. The layer recomputes its weight scales every
// forward (the weights move while training), so what convert_qat's quantize_per_channel computes
// from the final weights is exactly what the last forward used. The observer runs on the
// detached input before the fake quantization, as PyTorch's FakeQuantize does (this batch's range
// already counts), and writes its state back into the layer's buffers.
#include "models/compress/qat.h"

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "core/memory_category.h"
#include "ops/fake_quantize.h"
#include "ops/ops.h"

namespace mg {

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
  return choose_qparams_u8(input_lo.data<float>()[0], input_hi.data<float>()[0]);
}

Tensor FakeQuantLayer::forward(const Tensor& x) {
  auto scope = forward_scope();
  Tensor in = x;
  if (quantize_input_) {
    // the observer moves on training forwards only, once per batch (not again in a checkpoint
    // recomputation, which must reproduce the forward exactly), never on meta (no data)
    if (is_training() && !checkpoint_recomputing() && !x.is_meta()) {
      NoGradGuard ng;
      Observer obs({.kind = opt_.observer, .ema_constant = opt_.ema_constant});
      obs.restore(input_lo.data<float>()[0], input_hi.data<float>()[0], observed_batches());
      obs.observe(x.detach());
      fill_(input_lo, obs.lo());
      fill_(input_hi, obs.hi());
      fill_(input_batches, double(obs.batches()));
    }
    in = x.is_meta() ? fake_quantize_per_tensor(x, {}) : fake_quantize_per_tensor(x, input_qparams());
  }
  const Tensor w = weight_of_inner();
  Tensor scales;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    scales = per_channel_scales(w);
  }
  const Tensor wq = fake_quantize_per_channel(w, scales);  // (Cout, ...) like w, dw passes straight through
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

ConvertCounts convert_qat(Module& root) {
  bool any = false;
  for (auto& [name, m] : root.named_modules()) any = any || dynamic_cast<FakeQuantLayer*>(m);
  MG_CHECK(any, "convert_qat: the model has no FakeQuantLayer\n  hint: call prepare_qat and train before convert_qat");
  return convert_ptq(root);
}

}  // namespace mg
