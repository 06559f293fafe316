// MobileNetV2 (Sandler et al. 2018) as torchvision builds it: a stem conv, 17 inverted residual
// blocks (1x1 expand, 3x3 depthwise, 1x1 linear projection; ReLU6 and BatchNorm), a 1x1 conv to
// 1280 channels, global average pooling, dropout and a Linear classifier. Module names follow
// torchvision's (features.N.conv.M..., classifier.1) except that a conv-BN-ReLU6 unit names its
// parts conv / bn / act where torchvision has 0 / 1 / 2; load_torchvision_state_dict maps them.
// The small-input variant (mobilenetv2-32) keeps 32x32 images from shrinking too early.
// Shapes: N batch, C channels, H W spatial.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "models/nn/nn.h"

namespace mg {

struct MobileNetV2Config {
  double width_mult = 1.0;   // scales every channel count (rounded by make_divisible to 8)
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  // For 32x32 inputs: the stem conv and the first stride-2 stage (24 channels) use stride 1, so
  // the network downsamples 8x instead of 32x.
  bool small_input = false;
  double dropout = 0.2;      // before the classifier, as torchvision
  int64_t input_size = 224;  // the square input resolution the configuration is meant for
  // The expansion width (hidden channels) of each of the 17 inverted-residual blocks; empty: the
  // architecture's (input channels x expand ratio). Structured pruning (models/compress/) records
  // the narrower widths it leaves here, so a pruned model rebuilds from its config. A block with
  // expand ratio 1 has no expansion conv and keeps its input width.
  std::vector<int64_t> block_hidden{};

  // "mobilenetv2-32" (10 classes, small_input, 32x32) and "mobilenetv2-224" (1000 classes,
  // 224x224); throws listing the names.
  static MobileNetV2Config named(const std::string& name);
  static std::vector<std::string> names();
  nlohmann::json to_json() const;
  // Missing keys keep their defaults; an unknown key or an invalid value is an error.
  static MobileNetV2Config from_json(const nlohmann::json& j);
  void validate() const;
  // The 17 blocks' widths as the architecture defines them (block_hidden ignored), and as built.
  std::vector<int64_t> default_block_hidden() const;
  std::vector<int64_t> hidden_widths() const;
  std::vector<int64_t> expand_ratios() const;  // per block (1: no expansion conv)
};

// torchvision's _make_divisible: v rounded to the nearest multiple of `divisor` (at least
// divisor), never more than 10% below v.
int64_t make_divisible(double v, int64_t divisor = 8);

// Conv2d (no bias, padding (k-1)/2), BatchNorm2d and ReLU6: torchvision's Conv2dNormActivation
// (whose children are "0", "1", "2"), here named conv, bn, act. Training runs bn and act as one op
// (BatchNorm2d::forward_relu6): the block saves the convolution's output and no normalised tensor;
// act stays a child for names, torchvision weights and the int8 model. With recompute_bn_relu
// (selective checkpointing) the normalised and clipped output is recomputed in backward.
class ConvBNReLU6 : public UnaryModule {
 public:
  ConvBNReLU6(std::shared_ptr<Conv2d> conv, std::shared_ptr<BatchNorm2d> bn);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<ReLU6> act;
  bool recompute_bn_relu = false;
};
std::shared_ptr<ConvBNReLU6> conv_bn_relu6(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups,
                                           const InitOptions& init);

// x: (N, in, H, W) -> (N, out, H/stride, W/stride). child "conv": [expand 1x1 (when
// expand_ratio != 1)], depthwise 3x3 with the stride, project 1x1 (linear), BatchNorm. The input
// is added back when stride == 1 and in == out.
class InvertedResidual : public UnaryModule {
 public:
  // hidden: the expansion width (in * expand_ratio unless pruned); must be `in` when expand_ratio is 1.
  InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio, int64_t hidden,
                   const InitOptions& init);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Sequential> conv;
  bool use_residual;
  bool has_expand;  // conv[0] is the 1x1 expansion (expand_ratio != 1)
};

class MobileNetV2 : public Module {
 public:
  // Initialised as torchvision: conv weights kaiming normal (fan_out, std sqrt(2 / (Cout K K))),
  // BatchNorm weight 1 / bias 0, classifier weight N(0, 0.01^2) and bias 0. Any device, kMeta too.
  explicit MobileNetV2(MobileNetV2Config cfg, InitOptions init = {});
  // x: (N, in_channels, H, W) -> logits (N, num_classes).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  const MobileNetV2Config& config() const { return cfg_; }
  // Activation checkpointing over the 17 inverted-residual blocks (features.1 ... features.17;
  // the stem and the last 1x1 conv save as usual); selective: every batch norm + ReLU6 pair.
  void set_checkpoint(CheckpointPolicy policy);
  const CheckpointPolicy& checkpoint_policy() const { return checkpoint_; }

  // torchvision's name for one of this model's state_dict names: a ConvBNReLU6's "conv" / "bn"
  // children are torchvision's "0" / "1" ("features.1.conv.0.bn.weight" -> "features.1.conv.0.1.weight").
  static std::string torchvision_name(const std::string& name);
  // load_state_dict for a state dict with torchvision's names (torchvision's weights, the PyTorch
  // fixture); names that are neither are reported as unexpected, as by load_state_dict.
  LoadResult load_torchvision_state_dict(const NamedTensors& state, bool strict = true);

  std::shared_ptr<Sequential> features;    // stem, 17 blocks, final 1x1 conv
  std::shared_ptr<Sequential> classifier;  // "0" Dropout, "1" Linear

 private:
  MobileNetV2Config cfg_;
  CheckpointPolicy checkpoint_;
};

}  // namespace mg
