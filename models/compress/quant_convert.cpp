// The module-tree surgery of post-training quantization. Layers are found inside Sequentials
// (MobileNetV2 keeps every conv, BatchNorm and ReLU6 in one), swapped with Sequential::replace;
// GPT's Linears are typed members of its blocks, so they are swapped member by member.
#include "models/compress/quant_convert.h"

#include <cmath>
#include <set>

#include "autograd/grad_mode.h"
#include "models/mobilenet_v2.h"
#include "ops/ops.h"

namespace mg {
namespace {

std::vector<std::pair<std::string, Sequential*>> sequentials(Module& root) {
  std::vector<std::pair<std::string, Sequential*>> out;
  for (auto& [name, m] : root.named_modules())
    if (auto* s = dynamic_cast<Sequential*>(m)) out.emplace_back(name, s);
  return out;
}

std::string child_path(const std::string& parent, size_t i) {
  return parent.empty() ? std::to_string(i) : parent + "." + std::to_string(i);
}

// conv followed by bn -> a Conv2d with bias holding both (values computed in f64).
std::shared_ptr<Conv2d> fold(const Conv2d& conv, const BatchNorm2d& bn) {
  MG_CHECK(bn.num_features == conv.out_channels, "fold_batch_norms: BatchNorm2d has ", bn.num_features,
           " features after a conv with ", conv.out_channels, " output channels");
  Generator scratch(0);
  auto out = std::make_shared<Conv2d>(conv.in_channels, conv.out_channels, conv.kernel_size, conv.params, true,
                                      InitOptions{.gen = &scratch, .device = conv.weight.device()});
  NoGradGuard ng;
  const auto w = contiguous(conv.weight.detach()).to_double_vector();
  const auto g = bn.weight.to_double_vector(), beta = bn.bias.to_double_vector();
  const auto mean = bn.running_mean.to_double_vector(), var = bn.running_var.to_double_vector();
  const std::vector<double> b0 = conv.bias.defined() ? conv.bias.to_double_vector() : std::vector<double>(g.size(), 0.0);
  const int64_t C = conv.out_channels, inner = int64_t(w.size()) / C;
  std::vector<double> w2(w.size()), b2(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double k = g[size_t(c)] / std::sqrt(var[size_t(c)] + bn.eps);
    for (int64_t i = 0; i < inner; ++i) w2[size_t(c * inner + i)] = w[size_t(c * inner + i)] * k;
    b2[size_t(c)] = (b0[size_t(c)] - mean[size_t(c)]) * k + beta[size_t(c)];
  }
  copy_(out->weight, from_vector(w2, out->weight.shape()));
  copy_(out->bias, from_vector(b2, {C}));
  return out;
}

// A ReLU6 right after layer i (skipping absorbed layers) is fused into int8 conv `q`.
bool fuse_relu6(Sequential& s, size_t i, Int8ConvBase& q) {
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (dynamic_cast<Absorbed*>(s[j].get())) continue;
    if (!dynamic_cast<ReLU6*>(s[j].get())) return false;
    q.fused_relu6 = true;
    s.replace(j, std::make_shared<Absorbed>("FusedReLU6"));
    return true;
  }
  return false;
}

ConvertCounts convert(Module& root, bool calibrated) {
  ConvertCounts n;
  for (auto& [name, s] : sequentials(root))
    for (size_t i = 0; i < s->size(); ++i) {
      std::shared_ptr<UnaryModule> layer = (*s)[i];
      ActivationQParams q;
      Tensor weight_scales;  // undefined: max|w_c| / 127
      if (auto* observed = dynamic_cast<ObservedLayer*>(layer.get())) {
        if (observed->takes_int8_input()) {
          MG_CHECK(observed->observed_batches() > 0, "convert_ptq: layer '", child_path(name, i), "' (",
                   observed->type_name(), ") saw no calibration batch, so its input range is unknown\n"
                   "  hint: run at least one batch through the model after prepare_ptq (a training step after prepare_qat)");
          q = observed->input_qparams();
        }
        weight_scales = observed->weight_scales();
        layer = observed->float_layer();
      } else if (calibrated) {
        MG_CHECK(!runs_int8(*layer), "convert_ptq: layer '",
                 child_path(name, i), "' (", layer->type_name(), ") has no calibration probe\n"
                 "  hint: call prepare_ptq and run calibration batches before convert_ptq");
      }
      if (auto* c = dynamic_cast<Conv2d*>(layer.get())) {
        std::shared_ptr<Int8ConvBase> qc;
        if (Int8Conv2d::supports(*c)) qc = Int8Conv2d::from_float(*c, q, weight_scales);
        else if (Int8DepthwiseConv2d::supports(*c)) qc = Int8DepthwiseConv2d::from_float(*c, q, weight_scales);
        if (qc) {
          s->replace(i, qc);
          n.fused_relu6 += fuse_relu6(*s, i, *qc);
          ++n.int8;
        } else {
          s->replace(i, Int8WeightOnlyConv2d::from_float(*c, weight_scales));
          ++n.weight_only;
        }
      } else if (auto* l = dynamic_cast<Linear*>(layer.get()); l && layer->type_name() == "Linear") {
        s->replace(i, Int8Linear::from_float(*l, q, weight_scales));
        ++n.int8;
      }
    }
  n.linked = link_int8_chains(root);
  return n;
}

// The layers of s in order, nested Sequentials opened, absorbed layers left out.
void leaves(Sequential& s, std::vector<UnaryModule*>& out) {
  for (size_t i = 0; i < s.size(); ++i) {
    UnaryModule* m = s[i].get();
    if (auto* inner = dynamic_cast<Sequential*>(m)) leaves(*inner, out);
    else if (!dynamic_cast<Absorbed*>(m)) out.push_back(m);
  }
}

}  // namespace

int64_t link_int8_chains(Module& root) {
  int64_t n = 0;
  for (auto& [name, s] : sequentials(root)) {
    std::vector<UnaryModule*> seq;
    leaves(*s, seq);
    for (size_t i = 0; i + 1 < seq.size(); ++i) {
      auto* a = dynamic_cast<Int8ConvBase*>(seq[i]);
      auto* b = dynamic_cast<Int8ConvBase*>(seq[i + 1]);
      if (!a || !b || a->output_linked()) continue;
      a->link_output(&b->input);
      ++n;
    }
  }
  return n;
}

bool runs_int8(const UnaryModule& layer) {
  if (auto* c = dynamic_cast<const Conv2d*>(&layer)) return Int8Conv2d::supports(*c) || Int8DepthwiseConv2d::supports(*c);
  return dynamic_cast<const Linear*>(&layer) && layer.type_name() == "Linear";
}

CalibrationProbe::CalibrationProbe(std::shared_ptr<UnaryModule> in, ObserverOptions opt)
    : ObservedLayer("CalibrationProbe"), inner(std::move(in)), observer(opt) {
  register_module("inner", inner);
}

Tensor CalibrationProbe::forward(const Tensor& x) {
  observer.observe(x.detach());
  return inner->forward(x);
}

int64_t fold_batch_norms(Module& root) {
  int64_t n = 0;
  for (auto& [name, s] : sequentials(root))
    for (size_t i = 0; i < s->size(); ++i) {
      // MobileNetV2's conv-BN-ReLU6 unit (typed members) becomes a Sequential of the folded conv,
      // the absorbed BatchNorm and its ReLU6, so the later passes find its layers like any other.
      auto* unit = dynamic_cast<ConvBNReLU6*>((*s)[i].get());
      if (unit) {
        auto seq = std::make_shared<Sequential>();
        seq->push_back(fold(*unit->conv, *unit->bn));
        seq->push_back(std::make_shared<Absorbed>("FoldedBatchNorm"));
        seq->push_back(unit->act);
        s->replace(i, seq);
        ++n;
        continue;
      }
      if (i + 1 >= s->size()) continue;
      auto* conv = dynamic_cast<Conv2d*>((*s)[i].get());
      auto* bn = dynamic_cast<BatchNorm2d*>((*s)[i + 1].get());
      if (!conv || !bn) continue;
      s->replace(i, fold(*conv, *bn));
      s->replace(i + 1, std::make_shared<Absorbed>("FoldedBatchNorm"));
      ++n;
    }
  return n;
}

int64_t prepare_ptq(Module& root, ObserverOptions opt) {
  for (auto& [name, m] : root.named_modules())
    MG_CHECK(!dynamic_cast<BatchNorm2d*>(m), "prepare_ptq: layer '", name,
             "' is a BatchNorm2d; call fold_batch_norms first (int8 layers take the folded conv)");
  int64_t n = 0;
  for (auto& [name, s] : sequentials(root))
    for (size_t i = 0; i < s->size(); ++i) {
      std::shared_ptr<UnaryModule> layer = (*s)[i];
      if (!runs_int8(*layer)) continue;
      s->replace(i, std::make_shared<CalibrationProbe>(layer, opt));
      ++n;
    }
  return n;
}

ConvertCounts convert_ptq(Module& root) { return convert(root, true); }
ConvertCounts convert_ptq_structure(Module& root) { return convert(root, false); }

int64_t quantize_gpt_weight_only(GPT& model) {
  int64_t n = 0;
  auto swap = [&](Module& parent, const char* name, std::shared_ptr<Linear>& member) {
    MG_CHECK(member->type_name() == "Linear", "quantize_gpt_weight_only: '", name, "' is already a ",
             member->type_name(), "\n  hint: the model is already quantized");
    member = Int8WeightOnlyLinear::from_float(*member);
    parent.replace_child(name, member);
    ++n;
  };
  for_each_block_linear(model, swap);
  return n;
}

int64_t weight_bytes(const Module& m) {
  std::set<const Storage*> seen;
  int64_t bytes = 0;
  auto add = [&](const NamedTensors& ts) {
    for (const auto& [n, t] : ts)
      if (seen.insert(t.storage().get()).second) bytes += int64_t(t.storage()->nbytes());
  };
  add(m.named_parameters());
  add(m.named_buffers());
  return bytes;
}

}  // namespace mg
