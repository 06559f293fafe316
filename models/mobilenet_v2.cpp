// MobileNetV2 following torchvision/models/mobilenetv2.py line by line (same block table, channel
// rounding, names and initialisation), plus the small-input variant for 32x32 images. Parameter
// count at width 1.0 with 1000 classes: 3,504,872, torchvision's.
// Shapes: N batch, C channels, H W spatial.
#include "models/mobilenet_v2.h"

#include <cmath>
#include <map>

#include "models/nn/init.h"

namespace mg {
namespace {

// (t expand ratio, c channels, n repeats, s stride of the first repeat): the paper's Table 2.
struct StageSpec {
  int64_t expand, channels, repeats, stride;
};
constexpr StageSpec kStages[] = {{1, 16, 1, 1},  {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                 {6, 96, 3, 1},  {6, 160, 3, 2}, {6, 320, 1, 1}};
constexpr int64_t kStemChannels = 32, kLastChannels = 1280;
constexpr int64_t kNumBlocks = 17;  // the sum of the repeats

// Calls f(in, out, stride, expand) for the 17 blocks in order, with the channel widths and
// strides the configuration gives.
template <typename F>
void for_each_block(const MobileNetV2Config& cfg, F&& f) {
  int64_t channels = make_divisible(kStemChannels * cfg.width_mult);
  bool first_downsample = true;
  for (const StageSpec& s : kStages) {
    const int64_t out = make_divisible(double(s.channels) * cfg.width_mult);
    int64_t stride = s.stride;
    if (stride == 2 && first_downsample) {
      first_downsample = false;
      if (cfg.small_input) stride = 1;  // 32x32: keep the resolution through the 24-channel stage
    }
    for (int64_t i = 0; i < s.repeats; ++i) {
      f(channels, out, i == 0 ? stride : 1, s.expand);
      channels = out;
    }
  }
}

// torchvision's conv init: kaiming_normal_(mode="fan_out", nonlinearity="relu"), where
// fan_out = Cout * KH * KW (groups do not enter). The Conv2d constructor's own uniform draws come
// from a scratch generator, so `init`'s stream holds only these.
std::shared_ptr<Conv2d> kaiming_conv(int64_t in, int64_t out, int64_t kernel, Conv2dParams p, const InitOptions& init) {
  Generator scratch(0);
  InitOptions tmp = init;
  tmp.gen = &scratch;
  auto conv = std::make_shared<Conv2d>(in, out, kernel, p, /*bias=*/false, tmp);
  normal_(conv->weight, 0.0, std::sqrt(2.0 / double(out * kernel * kernel)), init.generator());
  return conv;
}

}  // namespace

int64_t make_divisible(double v, int64_t divisor) {
  int64_t rounded = std::max(divisor, int64_t(v + double(divisor) / 2) / divisor * divisor);
  if (double(rounded) < 0.9 * v) rounded += divisor;  // do not round down by more than 10%
  return rounded;
}

// ---- configuration --------------------------------------------------------------------------

std::vector<std::string> MobileNetV2Config::names() { return {"mobilenetv2-32", "mobilenetv2-224"}; }

MobileNetV2Config MobileNetV2Config::named(const std::string& name) {
  if (name == "mobilenetv2-32") return {.num_classes = 10, .small_input = true, .input_size = 32};
  if (name == "mobilenetv2-224") return {.num_classes = 1000, .small_input = false, .input_size = 224};
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  MG_THROW("MobileNetV2Config: unknown configuration '", name, "' (known: ", known, ")");
}

void MobileNetV2Config::validate() const {
  MG_CHECK(width_mult > 0 && std::isfinite(width_mult), "MobileNetV2Config: width_mult must be positive, got ",
           width_mult);
  MG_CHECK(num_classes > 0 && in_channels > 0 && input_size > 0,
           "MobileNetV2Config: num_classes, in_channels and input_size must be positive, got ", num_classes, ", ",
           in_channels, ", ", input_size);
  MG_CHECK(dropout >= 0.0 && dropout < 1.0, "MobileNetV2Config: dropout must be in [0, 1), got ", dropout);
  if (block_hidden.empty()) return;
  MG_CHECK(int64_t(block_hidden.size()) == kNumBlocks, "MobileNetV2Config: block_hidden must list the ", kNumBlocks,
           " blocks' widths, got ", block_hidden.size(), " entries");
  const std::vector<int64_t> def = default_block_hidden();
  int64_t b = 0;
  for_each_block(*this, [&](int64_t in, int64_t, int64_t, int64_t expand) {
    const int64_t h = block_hidden[size_t(b)];
    MG_CHECK(h > 0, "MobileNetV2Config: block_hidden[", b, "] must be positive, got ", h);
    MG_CHECK(expand != 1 || h == in, "MobileNetV2Config: block ", b, " has no expansion conv, so its width is its ",
             in, " input channels, got ", h);
    MG_CHECK(h <= def[size_t(b)], "MobileNetV2Config: block_hidden[", b, "] = ", h, " exceeds the architecture's ",
             def[size_t(b)]);
    ++b;
  });
}

std::vector<int64_t> MobileNetV2Config::default_block_hidden() const {
  std::vector<int64_t> h;
  for_each_block(*this, [&](int64_t in, int64_t, int64_t, int64_t expand) {
    h.push_back(int64_t(std::lround(double(in * expand))));
  });
  return h;
}

std::vector<int64_t> MobileNetV2Config::expand_ratios() const {
  std::vector<int64_t> r;
  for_each_block(*this, [&](int64_t, int64_t, int64_t, int64_t expand) { r.push_back(expand); });
  return r;
}

std::vector<int64_t> MobileNetV2Config::hidden_widths() const {
  return block_hidden.empty() ? default_block_hidden() : block_hidden;
}

nlohmann::json MobileNetV2Config::to_json() const {
  nlohmann::json j = {{"width_mult", width_mult},   {"num_classes", num_classes}, {"in_channels", in_channels},
                      {"small_input", small_input}, {"dropout", dropout},         {"input_size", input_size}};
  if (!block_hidden.empty()) j["block_hidden"] = block_hidden;  // only pruned models carry it
  return j;
}

MobileNetV2Config MobileNetV2Config::from_json(const nlohmann::json& j) {
  MG_CHECK(j.is_object(), "MobileNetV2Config.from_json: expected a JSON object, got ", j.dump());
  MobileNetV2Config c;
  for (const auto& [key, value] : j.items()) {
    if (key == "block_hidden") {
      MG_CHECK(value.is_array(), "MobileNetV2Config.from_json: 'block_hidden' must be an array of integers, got ",
               value.dump());
      for (const auto& v : value) {
        MG_CHECK(v.is_number_integer(), "MobileNetV2Config.from_json: 'block_hidden' must hold integers, got ",
                 v.dump());
        c.block_hidden.push_back(v.get<int64_t>());
      }
      continue;
    }
    const bool real = key == "width_mult" || key == "dropout", flag = key == "small_input";
    MG_CHECK(real ? value.is_number() : flag ? value.is_boolean() : value.is_number_integer(),
             "MobileNetV2Config.from_json: '", key, "' must be ", real ? "a number" : flag ? "a boolean" : "an integer",
             ", got ", value.dump());
    if (key == "width_mult") c.width_mult = value.get<double>();
    else if (key == "num_classes") c.num_classes = value.get<int64_t>();
    else if (key == "in_channels") c.in_channels = value.get<int64_t>();
    else if (key == "small_input") c.small_input = value.get<bool>();
    else if (key == "dropout") c.dropout = value.get<double>();
    else if (key == "input_size") c.input_size = value.get<int64_t>();
    else MG_THROW("MobileNetV2Config.from_json: unknown key '", key,
                  "' (known: width_mult, num_classes, in_channels, small_input, dropout, input_size, "
                  "block_hidden)");
  }
  c.validate();
  return c;
}

// ---- layers ----------------------------------------------------------------------------------

ConvBNReLU6::ConvBNReLU6(std::shared_ptr<Conv2d> c, std::shared_ptr<BatchNorm2d> b) : UnaryModule("ConvBNReLU6") {
  conv = register_module("conv", std::move(c));
  bn = register_module("bn", std::move(b));
  act = register_module("act", std::make_shared<ReLU6>());
}

Tensor ConvBNReLU6::forward(const Tensor& x) {
  auto scope = forward_scope();
  Tensor y = conv->forward(x);  // (N, out, H', W')
  // bn and act run as one op (batch_norm_relu6): the ReLU6 keeps no input of its own.
  if (!recompute_bn_relu) return bn->forward_relu6(y);
  // Selective checkpointing: the convolution's output is the only tensor kept.
  return checkpoint([bn = bn](const Tensor& t) { return bn->forward_relu6(t); }, y);
}

std::shared_ptr<ConvBNReLU6> conv_bn_relu6(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups,
                                           const InitOptions& init) {
  auto conv = kaiming_conv(in, out, kernel, {.stride = stride, .padding = (kernel - 1) / 2, .groups = groups}, init);
  return std::make_shared<ConvBNReLU6>(conv, std::make_shared<BatchNorm2d>(out, 1e-5, 0.1, init));
}

InvertedResidual::InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio, int64_t hidden,
                                   const InitOptions& init)
    : UnaryModule("InvertedResidual"), use_residual(stride == 1 && in == out), has_expand(expand_ratio != 1) {
  MG_CHECK(stride == 1 || stride == 2, "InvertedResidual: stride must be 1 or 2, got ", stride);
  MG_CHECK(hidden > 0 && (expand_ratio != 1 || hidden == in), "InvertedResidual: hidden width ", hidden,
           " must be positive (and equal the ", in, " input channels when expand_ratio is 1)");
  conv = register_module("conv", std::make_shared<Sequential>());
  if (expand_ratio != 1) conv->push_back(conv_bn_relu6(in, hidden, 1, 1, 1, init));    // expand (N, hidden, H, W)
  conv->push_back(conv_bn_relu6(hidden, hidden, 3, stride, hidden, init));             // depthwise
  conv->push_back(kaiming_conv(hidden, out, 1, {}, init));                             // project, no activation
  conv->push_back(std::make_shared<BatchNorm2d>(out, 1e-5, 0.1, init));
}

Tensor InvertedResidual::forward(const Tensor& x) {
  auto scope = forward_scope();
  Tensor y = conv->forward(x);
  return use_residual ? add(x, y) : y;
}

// ---- the model -------------------------------------------------------------------------------

MobileNetV2::MobileNetV2(MobileNetV2Config cfg, InitOptions init) : Module("MobileNetV2"), cfg_(cfg) {
  cfg_.validate();
  int64_t channels = make_divisible(kStemChannels * cfg_.width_mult);
  const int64_t last = make_divisible(kLastChannels * std::max(1.0, cfg_.width_mult));
  features = register_module("features", std::make_shared<Sequential>());
  features->push_back(conv_bn_relu6(cfg_.in_channels, channels, 3, cfg_.small_input ? 1 : 2, 1, init));  // stem
  const std::vector<int64_t> hidden = cfg_.hidden_widths();
  size_t b = 0;
  for_each_block(cfg_, [&](int64_t in, int64_t out, int64_t stride, int64_t expand) {
    features->push_back(std::make_shared<InvertedResidual>(in, out, stride, expand, hidden[b++], init));
    channels = out;
  });
  features->push_back(conv_bn_relu6(channels, last, 1, 1, 1, init));  // (N, 1280, H', W')

  classifier = register_module("classifier", std::make_shared<Sequential>());
  classifier->push_back(std::make_shared<Dropout>(cfg_.dropout));
  Generator scratch(0);
  InitOptions tmp = init;
  tmp.gen = &scratch;
  auto fc = classifier->push_back(std::make_shared<Linear>(last, cfg_.num_classes, true, tmp));
  normal_(fc->weight, 0.0, 0.01, init.generator());
  fill_(fc->bias, 0.0);
}

Tensor MobileNetV2::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() == 4 && x.size(1) == cfg_.in_channels, "MobileNetV2: expected input (N, ",
           cfg_.in_channels, ", H, W), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  // features: the stem, the inverted-residual blocks features[1 .. n-2] under the checkpoint
  // policy (autograd/checkpoint.h: checkpoint_sequential), the last 1x1 conv.
  auto features_scope = features->forward_scope();
  const Sequential& fs = *features;
  std::vector<BlockFn> blocks;
  for (size_t i = 1; i + 1 < fs.size(); ++i)
    blocks.push_back([block = fs[i]](const Tensor& t) { return (*block)(t); });
  Tensor f = (*fs[0])(x);                            // stem; (*m)(x) moves x to a placed block
  f = checkpoint_sequential(blocks, checkpoint_, f);
  f = (*fs[fs.size() - 1])(f);                       // (N, 1280, H', W')
  return (*classifier)(global_avg_pool2d(f));        // (N, 1280) -> (N, classes)
}

std::string MobileNetV2::torchvision_name(const std::string& name) {
  // Split at dots; "bn" only names a ConvBNReLU6's batch norm, and "conv" names a ConvBNReLU6's
  // convolution exactly when a parameter name follows it (an InvertedResidual's "conv" is
  // followed by an index).
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string p = parts[i];
    if (p == "bn") p = "1";
    else if (p == "conv" && i + 2 == parts.size()) p = "0";
    out += (i ? "." : "") + p;
  }
  return out;
}

LoadResult MobileNetV2::load_torchvision_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, std::string> ours;  // torchvision name -> this model's name
  for (const auto& [name, t] : state_dict()) ours[torchvision_name(name)] = name;
  NamedTensors renamed;
  renamed.reserve(state.size());
  for (const auto& [name, t] : state) {
    auto it = ours.find(name);
    renamed.emplace_back(it == ours.end() ? name : it->second, t);
  }
  return load_state_dict(renamed, strict);
}

void MobileNetV2::set_checkpoint(CheckpointPolicy policy) {
  checkpoint_ = policy;
  const bool selective = policy.kind == CheckpointPolicy::Kind::selective;
  for (auto& [name, m] : named_modules())
    if (auto* c = dynamic_cast<ConvBNReLU6*>(m)) c->recompute_bn_relu = selective;
}

}  // namespace mg
