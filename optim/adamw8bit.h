// AdamW with 8-bit optimizer state (Dettmers et al. 2022, bitsandbytes' Adam8bit): both moments
// are stored block-wise quantized, blocks of 2048 elements, each block as 2048 u8 codes into a
// 256-value dynamic (exponent) map plus one f32 absmax: m with the signed map, v with the
// unsigned one. A step dequantizes a block into f32 registers, applies AdamW's rule exactly as
// optim/adam.h, and requantizes (round to the nearest code, deterministic). Tensors under 4096
// elements keep f32 moments. State bytes: ~2 per element instead of 8 (75% less).
// State names: exp_avg_q8, exp_avg_absmax, exp_avg_sq_q8, exp_avg_sq_absmax (or exp_avg and
// exp_avg_sq for small tensors), saved and loaded by the base class like any other state.
#pragma once
#include <array>

#include "optim/adam.h"

namespace mg {

struct AdamW8bitOptions {
  AdamOptions adam;
  int64_t block_size = 2048;  // elements per absmax
  int64_t min_8bit_size = 4096;  // smaller tensors keep f32 moments
};

class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(std::vector<ParamGroup> groups, AdamW8bitOptions opt = {});
  // One group with every parameter (weight decay 0.01 as AdamW).
  AdamW8bit(const NamedTensors& params, double lr, double weight_decay = 0.01, AdamW8bitOptions opt = {});
  const AdamW8bitOptions& options() const { return opt_; }

  // The 256 sorted code values (bitsandbytes' create_dynamic_map(signed)), for tests and docs.
  static const std::array<float, 256>& dynamic_map(bool is_signed);
  // x / absmax in [-1, 1] (or [0, 1]) -> index of the nearest code of dynamic_map(is_signed); a tie
  // goes to the lower code. Looks the search's start up by x's leading bits (Note [Code index]).
  static uint8_t quantize_code(float x, bool is_signed);
  // The specification quantize_code is checked against: a binary search of `map`.
  static uint8_t quantize_code_ref(float x, const std::array<float, 256>& map);

 protected:
  std::vector<std::string> state_names() const override;
  std::vector<StateSpec> state_specs(const Tensor& param) const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) override;
  std::map<std::string, std::string> hyperparameters() const override;

 private:
  bool quantized(const Tensor& param) const { return param.numel() >= opt_.min_8bit_size; }
  AdamW8bitOptions opt_;
};

}  // namespace mg
