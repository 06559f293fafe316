// Knowledge distillation (Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural
// Network"): a pruned (or otherwise shrunk) student learns from the model it was cut from. Besides
// the labels, it matches the teacher's softened class distribution, which says much more per
// example than one hard label ("this shirt looks like a T-shirt, a little like a pullover"):
//   loss = (1 - w) * CE(student, labels) + w * T^2 * KL(softmax(t / T) || softmax(s / T))
// with the KL term averaged over examples. The T^2 keeps the soft term's gradient on the scale of
// the hard one's as T grows (its gradient shrinks as 1/T^2). `memgrad prune --distill W` fine-tunes
// a pruned run this way, with the unpruned source run as the teacher.
#pragma once
#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mg {

struct DistillationOptions {
  double weight = 0.5;       // w in [0, 1]: the soft term's share of the loss (0: labels only)
  double temperature = 4.0;  // T > 0: softens both distributions (1: the plain softmax)

  // Checks the ranges above; throws naming `who` and the bad value.
  void validate(const char* who) const;
  nlohmann::json to_json() const;
  static DistillationOptions from_json(const nlohmann::json& j);
};

// The loss above for (N, C) logits and (N) class labels. The teacher's logits carry no graph (they
// are read only), and the KL term is the true divergence (zero when the student matches the
// teacher), so the value is comparable across runs. f32 math whatever the logits' dtype.
Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& labels,
                         const DistillationOptions& o);

}  // namespace mg
