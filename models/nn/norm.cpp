// Normalisation layers: BatchNorm2d (batch statistics while training, running ones in eval) and
// LayerNorm (over the last dim). The arithmetic is batch_norm / layer_norm in ops/.
#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "models/nn/layers.h"

namespace mg {
namespace {

Tensor filled(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = parameter_empty(shape, dtype, device);
  fill_(t, value);
  return t;
}

}  // namespace

BatchNorm2d::BatchNorm2d(int64_t c, double eps_, double momentum_, const InitOptions& init)
    : UnaryModule("BatchNorm2d"), num_features(c), eps(eps_), momentum(momentum_) {
  MG_CHECK(c > 0, "BatchNorm2d: num_features must be positive, got ", c);
  weight = register_parameter("weight", filled({c}, 1.0, init.dtype, init.device));
  bias = register_parameter("bias", filled({c}, 0.0, init.dtype, init.device));
  running_mean = register_buffer("running_mean", filled({c}, 0.0, init.dtype, init.device));
  running_var = register_buffer("running_var", filled({c}, 1.0, init.dtype, init.device));
  num_batches_tracked = register_buffer("num_batches_tracked", filled({}, 0.0, DType::i64, init.device));
}

Tensor BatchNorm2d::forward(const Tensor& x) { return normalize(x, false); }

Tensor BatchNorm2d::forward_relu6(const Tensor& x) { return normalize(x, true); }

Tensor BatchNorm2d::normalize(const Tensor& x, bool relu6) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && (x.dim() == 4 || x.dim() == 2) && x.size(1) == num_features,
           "BatchNorm2d: expected input (N, ", num_features, ", H, W) or (N, ", num_features, "), got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  // A checkpointed block recomputed in backward normalises with the same batch statistics but
  // must not move the running ones (or the counter) a second time.
  const bool replay = is_training() && checkpoint_recomputing();
  Tensor y = (relu6 ? batch_norm_relu6 : batch_norm)(x, replay ? Tensor() : running_mean,
                                                     replay ? Tensor() : running_var, weight, bias, is_training(),
                                                     momentum, eps);
  if (is_training() && !replay && !num_batches_tracked.is_meta()) {
    // A counter, not part of any graph: written directly on the host, through an op elsewhere.
    NoGradGuard no_grad;
    if (num_batches_tracked.device().is_cpu()) {
      num_batches_tracked.data<int64_t>()[0] += 1;
      num_batches_tracked.bump_version();
    } else {
      copy_(num_batches_tracked, add(num_batches_tracked, 1.0));
    }
  }
  return y;
}

LayerNorm::LayerNorm(int64_t c, double eps_, bool with_bias, const InitOptions& init)
    : UnaryModule("LayerNorm"), normalized_size(c), eps(eps_) {
  MG_CHECK(c > 0, "LayerNorm: normalized_size must be positive, got ", c);
  weight = register_parameter("weight", filled({c}, 1.0, init.dtype, init.device));
  if (with_bias) bias = register_parameter("bias", filled({c}, 0.0, init.dtype, init.device));
}

Tensor LayerNorm::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == normalized_size, "LayerNorm: expected input (..., ",
           normalized_size, "), got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return layer_norm(x, weight, bias, eps);
}

}  // namespace mg
