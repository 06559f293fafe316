// AdamW8bit's dynamic maps, block quantization and update. Blocks are independent, so they run
// in parallel and each is computed the same way on any thread count (bit-exact resume).
#include "optim/adamw8bit.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/parallel.h"

namespace mg {
namespace {

constexpr int64_t kMaxBlock = 4096;  // block_size limit: a block's f32 moments live on the stack

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent i in
// 0..6, the midpoints of linspace(0.1, 1, n_i + 1) scaled by 10^(i - 6), with n_i = 2^i (signed,
// and their negatives) or 2^(i+1) (unsigned); plus 0 and 1. Sorted.
std::array<float, 256> make_map(bool is_signed) {
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const int items = is_signed ? (1 << i) : (1 << (i + 1));  // fraction_items - 1
    const double scale = std::pow(10.0, double(i - 6));
    for (int j = 0; j < items; ++j) {
      const double b0 = 0.1 + 0.9 * double(j) / items, b1 = 0.1 + 0.9 * double(j + 1) / items;
      data.push_back(scale * (b0 + b1) / 2);
      if (is_signed) data.push_back(-scale * (b0 + b1) / 2);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  while (data.size() < 256) data.push_back(0.0);
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  for (size_t i = 0; i < 256; ++i) out[i] = float(data[i]);
  return out;
}

// Note [Code index]: a binary search of 256 codes per moment per step (two per parameter) was most
// of the update's time: eight unpredictable branches each. Floats in the same bucket of their
// leading 14 bits (sign, exponent, 5 mantissa bits: 3% wide) share the start of the search: the
// lower bound of the bucket's least value. From there a short forward scan (a few codes per
// bucket at most) reaches the same lower bound as the binary search, so the codes are identical.
class CodeIndex {
 public:
  static constexpr int kBits = 14;
  explicit CodeIndex(const std::array<float, 256>& map) : map_(map) {
    for (uint32_t b = 0; b < (1u << kBits); ++b) {
      const float least = std::bit_cast<float>(from_key(b << (32 - kBits)));
      start_[b] = uint16_t(std::lower_bound(map.begin(), map.end(), least) - map.begin());
    }
  }
  // std::lower_bound(map, x) as an index (256: past the end).
  uint32_t lower_bound(float x) const {
    if (std::isnan(x)) return 0;  // no code compares below NaN: the binary search stops at the first
    uint32_t i = start_[to_key(std::bit_cast<uint32_t>(x)) >> (32 - kBits)];
    while (i < 256 && map_[i] < x) ++i;
    return i;
  }

 private:
  // Float bits -> an unsigned key in the floats' order (negatives reversed below the positives).
  static uint32_t to_key(uint32_t bits) { return bits & 0x80000000u ? ~bits : bits | 0x80000000u; }
  static uint32_t from_key(uint32_t key) { return key & 0x80000000u ? key & 0x7fffffffu : ~key; }
  const std::array<float, 256>& map_;
  uint16_t start_[1u << kBits];
};

uint8_t nearest(float x, uint32_t hi, const std::array<float, 256>& map) {
  if (hi == 0) return 0;
  if (hi == 256) return 255;
  return uint8_t((x - map[hi - 1]) <= (map[hi] - x) ? hi - 1 : hi);  // nearest; a tie goes down
}

const CodeIndex& code_index(bool is_signed) {
  // 32 KiB each, built on first use: constant tables, like the maps themselves.
  static const std::unique_ptr<const CodeIndex> s = std::make_unique<CodeIndex>(AdamW8bit::dynamic_map(true)),
                                                u = std::make_unique<CodeIndex>(AdamW8bit::dynamic_map(false));
  return is_signed ? *s : *u;
}

}  // namespace

const std::array<float, 256>& AdamW8bit::dynamic_map(bool is_signed) {
  static const std::array<float, 256> s = make_map(true), u = make_map(false);
  return is_signed ? s : u;
}

uint8_t AdamW8bit::quantize_code(float x, bool is_signed) {
  return nearest(x, code_index(is_signed).lower_bound(x), dynamic_map(is_signed));
}

uint8_t AdamW8bit::quantize_code_ref(float x, const std::array<float, 256>& map) {
  return nearest(x, uint32_t(std::lower_bound(map.begin(), map.end(), x) - map.begin()), map);
}

AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, AdamW8bitOptions opt)
    : Optimizer("AdamW8bit", std::move(groups)), opt_(opt) {
  const AdamOptions& a = opt_.adam;
  MG_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1, "AdamW8bit: betas must be in [0, 1), got (",
           a.beta1, ", ", a.beta2, ")");
  MG_CHECK(a.eps >= 0, "AdamW8bit: eps must be >= 0, got ", a.eps);
  MG_CHECK(opt_.block_size > 0 && opt_.block_size <= kMaxBlock && opt_.min_8bit_size >= 0,
           "AdamW8bit: block_size must be in [1, ", kMaxBlock, "], got ", opt_.block_size);
  for (const auto& g : param_groups())
    for (const auto& [n, p] : g.params)
      MG_CHECK(p.dtype() == DType::f32, "AdamW8bit: parameter '", n, "' is ", p.dtype(),
               "; 8-bit state is implemented for f32 parameters (keep f32 master weights, e.g. with autocast)");
}

AdamW8bit::AdamW8bit(const NamedTensors& params, double lr, double weight_decay, AdamW8bitOptions opt)
    : AdamW8bit(std::vector<ParamGroup>{{.name = "", .params = params, .lr = lr, .weight_decay = weight_decay}}, opt) {}

std::vector<std::string> AdamW8bit::state_names() const {
  return {"exp_avg_q8", "exp_avg_absmax", "exp_avg_sq_q8", "exp_avg_sq_absmax"};
}

std::vector<Optimizer::StateSpec> AdamW8bit::state_specs(const Tensor& p) const {
  if (!quantized(p)) return {{"exp_avg", p.shape(), DType::f32}, {"exp_avg_sq", p.shape(), DType::f32}};
  const int64_t blocks = (p.numel() + opt_.block_size - 1) / opt_.block_size;
  return {{"exp_avg_q8", {p.numel()}, DType::u8},
          {"exp_avg_absmax", {blocks}, DType::f32},
          {"exp_avg_sq_q8", {p.numel()}, DType::u8},
          {"exp_avg_sq_absmax", {blocks}, DType::f32}};
}

std::map<std::string, std::string> AdamW8bit::hyperparameters() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.17g", opt_.adam.eps);
  return {{"beta1", std::to_string(opt_.adam.beta1)}, {"beta2", std::to_string(opt_.adam.beta2)}, {"eps", buf},
          {"block_size", std::to_string(opt_.block_size)}, {"min_8bit_size", std::to_string(opt_.min_8bit_size)}};
}

void AdamW8bit::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) {
  if (param.is_meta() || param.numel() == 0) return;
  MG_CHECK(param.device().is_cpu(), "AdamW8bit: the update runs on the CPU only, got ", param.device().str());
  const double lr = group.lr, wd = group.weight_decay, b1 = opt_.adam.beta1, b2 = opt_.adam.beta2;
  const double t = double(s.step);
  const float c_decay = float(1 - lr * wd), c_1mb1 = float(1 - b1), c_b2 = float(b2), c_1mb2 = float(1 - b2);
  const float c_bc2 = float(std::sqrt(1 - std::pow(b2, t))), c_eps = float(opt_.adam.eps);
  const float c_step = float(lr / (1 - std::pow(b1, t)));
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  // AdamW's rule on one element (optim/adam.cpp's order of operations).
  auto adamw = [=](float& wi, float gi, float& m, float& v) {
    if (wd != 0) wi = wi * c_decay;
    m = m + c_1mb1 * (gi - m);
    v = v * c_b2 + c_1mb2 * gi * gi;
    wi = wi - c_step * (m / (std::sqrt(v) / c_bc2 + c_eps));
  };
  const int64_t n = param.numel();
  if (!quantized(param)) {
    float* m = s.tensors[0].second.data<float>();
    float* v = s.tensors[1].second.data<float>();
    for (int64_t i = 0; i < n; ++i) adamw(w[i], g[i], m[i], v[i]);
    return;
  }
  uint8_t* mq = s.tensors[0].second.data<uint8_t>();
  float* ma = s.tensors[1].second.data<float>();
  uint8_t* vq = s.tensors[2].second.data<uint8_t>();
  float* va = s.tensors[3].second.data<float>();
  const auto& smap = dynamic_map(true);
  const auto& umap = dynamic_map(false);
  const CodeIndex& sindex = code_index(true);  // looked up once, not per element
  const CodeIndex& uindex = code_index(false);
  const int64_t B = opt_.block_size, blocks = (n + B - 1) / B;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    float m[kMaxBlock], v[kMaxBlock];  // one block's new moments in f32, on the stack
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t begin = blk * B, len = std::min(n, begin + B) - begin;
      float m_max = 0.f, v_max = 0.f;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = begin + j;
        m[j] = smap[mq[i]] * ma[blk];
        v[j] = umap[vq[i]] * va[blk];
        adamw(w[i], g[i], m[j], v[j]);
        m_max = std::max(m_max, std::fabs(m[j]));
        v_max = std::max(v_max, v[j]);
      }
      // requantize with the block's new absmax
      const float m_inv = m_max > 0 ? 1.f / m_max : 0.f, v_inv = v_max > 0 ? 1.f / v_max : 0.f;
      for (int64_t j = 0; j < len; ++j) {
        const float mx = m[j] * m_inv, vx = v[j] * v_inv;
        mq[begin + j] = nearest(mx, sindex.lower_bound(mx), smap);
        vq[begin + j] = nearest(vx, uindex.lower_bound(vx), umap);
      }
      ma[blk] = m_max;
      va[blk] = v_max;
    }
  });
}

}  // namespace mg
