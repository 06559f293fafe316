// Knowledge distillation's loss (see distillation.h).
#include "models/compress/distillation.h"

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/ops.h"

namespace mg {

void DistillationOptions::validate(const char* who) const {
  MG_CHECK(weight >= 0.0 && weight <= 1.0, who, ": the distillation weight must be in [0, 1] (the soft "
           "targets' share of the loss), got ", weight);
  MG_CHECK(temperature > 0.0, who, ": the distillation temperature must be > 0, got ", temperature);
}

nlohmann::json DistillationOptions::to_json() const { return {{"weight", weight}, {"temperature", temperature}}; }

DistillationOptions DistillationOptions::from_json(const nlohmann::json& j) {
  return {.weight = j.at("weight").get<double>(), .temperature = j.at("temperature").get<double>()};
}

Tensor distillation_loss(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& labels,
                         const DistillationOptions& o) {
  o.validate("distillation_loss");
  MG_CHECK(student_logits.dim() == 2 && student_logits.shape() == teacher_logits.shape(),
           "distillation_loss: student and teacher logits must both be (N, C) of one shape, got ",
           student_logits.shape(), " and ", teacher_logits.shape());
  MG_CHECK(student_logits.device() == teacher_logits.device(), "distillation_loss: the student's logits are on ",
           student_logits.device(), ", the teacher's on ", teacher_logits.device());
  const Tensor s = student_logits.dtype() == DType::f64 ? student_logits : cast(student_logits, DType::f32);
  if (o.weight == 0.0) return cross_entropy(s, labels);
  Tensor log_p, p;  // the teacher's softened distribution, no graph
  {
    NoGradGuard no_grad;
    const Tensor t = cast(teacher_logits, s.dtype()) / o.temperature;
    log_p = log_softmax(t, 1);
    p = exp(log_p);
  }
  const double n = double(s.shape()[0]);
  const Tensor kl = sum(p * (log_p - log_softmax(s / o.temperature, 1))) / n;
  const Tensor soft = kl * (o.temperature * o.temperature);
  if (o.weight == 1.0) return soft;
  return cross_entropy(s, labels) * (1.0 - o.weight) + soft * o.weight;
}

}  // namespace mg
