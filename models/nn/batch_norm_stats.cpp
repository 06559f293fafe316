// Precise BatchNorm statistics (see batch_norm_stats.h): the cumulative average over k batches is
// the exponential one with momentum 1 / (k + 1) at the k-th batch (0-based), so setting that
// momentum before each forward turns BatchNorm's own update into a plain mean.
#include "models/nn/batch_norm_stats.h"

#include <vector>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "models/nn/layers.h"
#include "ops/ops.h"

namespace mg {

int64_t recompute_batch_norm_stats(Module& model, int64_t num_batches, const std::function<void(int64_t)>& run_batch) {
  MG_CHECK(num_batches > 0, "recompute_batch_norm_stats: num_batches must be positive, got ", num_batches);
  std::vector<BatchNorm2d*> norms;
  for (auto& [_, m] : model.named_modules())
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) norms.push_back(bn);
  if (norms.empty()) return 0;
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.train();
  std::vector<double> momenta;
  std::vector<Tensor> counters;
  for (BatchNorm2d* bn : norms) {
    momenta.push_back(bn->momentum);
    counters.push_back(clone(bn->num_batches_tracked));
  }
  for (int64_t k = 0; k < num_batches; ++k) {
    for (BatchNorm2d* bn : norms) bn->momentum = 1.0 / double(k + 1);
    run_batch(k);
  }
  for (size_t i = 0; i < norms.size(); ++i) {
    norms[i]->momentum = momenta[i];
    copy_(norms[i]->num_batches_tracked, counters[i]);
  }
  model.train(was_training);
  return int64_t(norms.size());
}

}  // namespace mg
