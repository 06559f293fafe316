// Linear: y = x W^T + b with PyTorch's default initialisation.
#include "models/nn/init.h"
#include "models/nn/layers.h"

namespace mg {

Linear::Linear(int64_t in, int64_t out, bool with_bias, const InitOptions& init)
    : UnaryModule("Linear"), in_features(in), out_features(out) {
  MG_CHECK(in > 0 && out > 0, "Linear: sizes must be positive, got in_features ", in, ", out_features ", out);
  // kaiming_uniform_(a = sqrt(5)) gives bound sqrt(6 / ((1 + 5) * fan_in)) = 1/sqrt(fan_in); the
  // bias uses the same bound.
  const double bound = fan_in_bound(in);
  Tensor w = parameter_empty({out, in}, init.dtype, init.device);
  uniform_(w, -bound, bound, init.generator());
  weight = register_parameter("weight", w);
  if (with_bias) {
    Tensor b = parameter_empty({out}, init.dtype, init.device);
    uniform_(b, -bound, bound, init.generator());
    bias = register_parameter("bias", b);
  }
}

Linear::Linear(std::string type_name, int64_t in, int64_t out)
    : UnaryModule(std::move(type_name)), in_features(in), out_features(out) {
  MG_CHECK(in > 0 && out > 0, this->type_name(), ": sizes must be positive, got in_features ", in,
           ", out_features ", out);
}

Tensor Linear::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features, "Linear: expected input (..., ", in_features,
           "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return linear(x, weight, bias);
}

}  // namespace mg
