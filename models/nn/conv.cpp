// Conv2d: a square-kernel 2-D convolution (with groups, so depthwise convs are Conv2d with
// groups = channels) and PyTorch's default initialisation.
#include "models/nn/init.h"
#include "models/nn/layers.h"

namespace mg {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, Conv2dParams p, bool with_bias, const InitOptions& init)
    : UnaryModule("Conv2d"), in_channels(in), out_channels(out), kernel_size(k), params(p) {
  MG_CHECK(in > 0 && out > 0 && k > 0, "Conv2d: channels and kernel size must be positive, got ", in, " -> ", out,
           ", kernel ", k);
  MG_CHECK(p.groups > 0 && in % p.groups == 0 && out % p.groups == 0, "Conv2d: groups ", p.groups,
           " must divide in_channels ", in, " and out_channels ", out);
  MG_CHECK(p.stride > 0 && p.padding >= 0, "Conv2d: stride must be positive and padding non-negative, got stride ",
           p.stride, ", padding ", p.padding);
  const int64_t fan_in = in / p.groups * k * k;
  const double bound = fan_in_bound(fan_in);
  Tensor w = parameter_empty({out, in / p.groups, k, k}, init.dtype, init.device);
  uniform_(w, -bound, bound, init.generator());
  weight = register_parameter("weight", w);
  if (with_bias) {
    Tensor b = parameter_empty({out}, init.dtype, init.device);
    uniform_(b, -bound, bound, init.generator());
    bias = register_parameter("bias", b);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_channels, "Conv2d: expected input (N, ", in_channels,
           ", H, W), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return conv2d(x, weight, bias, params);
}

}  // namespace mg
