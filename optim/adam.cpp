// Adam / AdamW's element-wise update (see adam.h for the rule). The scalar factors (bias
// corrections, step size) are computed in f64 once per parameter, then the loop runs in the
// compute type, following PyTorch's order of operations so results agree to rounding.
// The f32 loop (f32 parameters and the f32 masters of 16-bit ones) runs 16 or 8 lanes at a time
// with AVX-512 or AVX2 (compile-time), its roundings spelled out: Note [AdamW's f32 roundings].
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 in _mm512_sqrt_ps
#endif
#include "optim/adam.h"

#include <cmath>
#include <cstdio>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "ops/cuda/launchers.h"

namespace mg {
namespace {

// Note [AdamW's f32 roundings]. The update of one f32 element, each step rounded as the scalar
// loop memgrad's losses were pinned with rounds it (GCC fused these multiply-adds there; sqrt and
// the divisions are IEEE-exact in every lane), so the SIMD loop gives the same bits:
//   decoupled: w1 = w * decay                coupled: d = fma(wd, w, g)
//   m = fma(d - m, 1 - b1, m);   v = fma(v, b2, ((1 - b2) * d) * d)
//   w = fma(-step, m / (sqrt(v) / bc2 + eps), w1)
struct AdamF32 {
  float decay, wd, one_minus_b1, b2, one_minus_b2, bc2, eps, step;
  bool decoupled, has_wd;
};

inline void adam_f32_scalar(float* w, const float* g, float* m, float* v, int64_t i, int64_t n, const AdamF32& k) {
  for (; i < n; ++i) {
    float d = g[i], wi = w[i];
    if (k.has_wd) {
      if (k.decoupled) wi = wi * k.decay;
      else d = std::fma(k.wd, wi, d);
    }
    const float mi = std::fma(d - m[i], k.one_minus_b1, m[i]);
    const float vi = std::fma(v[i], k.b2, (k.one_minus_b2 * d) * d);
    m[i] = mi;
    v[i] = vi;
    w[i] = std::fma(-k.step, mi / (std::sqrt(vi) / k.bc2 + k.eps), wi);
  }
}

#if defined(__AVX512F__)
using VecF = __m512;
constexpr int64_t kLanes = 16;
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VecF x) { _mm512_storeu_ps(p, x); }
inline VecF vset(float x) { return _mm512_set1_ps(x); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vdiv(VecF a, VecF b) { return _mm512_div_ps(a, b); }
inline VecF vsqrt(VecF a) { return _mm512_sqrt_ps(a); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
using VecF = __m256;
constexpr int64_t kLanes = 8;
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VecF x) { _mm256_storeu_ps(p, x); }
inline VecF vset(float x) { return _mm256_set1_ps(x); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF vdiv(VecF a, VecF b) { return _mm256_div_ps(a, b); }
inline VecF vsqrt(VecF a) { return _mm256_sqrt_ps(a); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
#else
constexpr int64_t kLanes = 0;  // no SIMD: the scalar loop does every element
#endif

// w, g, m, v: n elements each (distinct arrays).
void adam_f32(float* w, const float* g, float* m, float* v, int64_t n, const AdamF32& k) {
  int64_t i = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  const VecF decay = vset(k.decay), wd = vset(k.wd), b1c = vset(k.one_minus_b1), b2 = vset(k.b2);
  const VecF b2c = vset(k.one_minus_b2), bc2 = vset(k.bc2), eps = vset(k.eps), neg_step = vset(-k.step);
  for (; i + kLanes <= n; i += kLanes) {
    VecF d = vload(g + i), wi = vload(w + i);
    if (k.has_wd) {
      if (k.decoupled) wi = vmul(wi, decay);
      else d = vfma(wd, wi, d);
    }
    const VecF mo = vload(m + i), vo = vload(v + i);
    const VecF mi = vfma(vsub(d, mo), b1c, mo);
    const VecF vi = vfma(vo, b2, vmul(vmul(b2c, d), d));
    vstore(m + i, mi);
    vstore(v + i, vi);
    vstore(w + i, vfma(neg_step, vdiv(mi, vadd(vdiv(vsqrt(vi), bc2), eps)), wi));
  }
#endif
  adam_f32_scalar(w, g, m, v, i, n, k);
}

}  // namespace

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions opt, bool decoupled)
    : Optimizer(std::move(name), std::move(groups)), opt_(opt), decoupled_(decoupled) {
  MG_CHECK(opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 && opt.beta2 < 1, type_name(), ": betas must be in [0, 1), got (",
           opt.beta1, ", ", opt.beta2, ")");
  MG_CHECK(opt.eps >= 0, type_name(), ": eps must be >= 0, got ", opt.eps);
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions opt) : Adam("Adam", std::move(groups), opt, false) {}

Adam::Adam(const NamedTensors& params, double lr, double weight_decay, AdamOptions opt)
    : Adam(std::vector<ParamGroup>{{.name = "", .params = params, .lr = lr, .weight_decay = weight_decay}}, opt) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions opt) : Adam("AdamW", std::move(groups), opt, true) {}

AdamW::AdamW(const NamedTensors& params, double lr, double weight_decay, AdamOptions opt)
    : AdamW(std::vector<ParamGroup>{{.name = "", .params = params, .lr = lr, .weight_decay = weight_decay}}, opt) {}

std::map<std::string, std::string> Adam::hyperparameters() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.17g", opt_.eps);
  return {{"beta1", std::to_string(opt_.beta1)}, {"beta2", std::to_string(opt_.beta2)}, {"eps", buf}};
}

void Adam::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& s) {
  const double lr = group.lr, wd = group.weight_decay;
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double t = double(s.step);
  const double bias_correction1 = 1 - std::pow(b1, t);
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(b2, t));
  const double step_size = lr / bias_correction1;
  const bool decoupled = decoupled_;
  const double eps = opt_.eps;
  if (param.device().is_cuda()) {  // the fused kernel, same order of operations
    const bool master = s.master.defined();
    cuda::adam_step(master ? s.master : param, grad, s.tensors[0].second, s.tensors[1].second,
                    master ? param : Tensor(), {lr, wd, b1, b2, eps, bias_correction1, bias_correction2_sqrt, decoupled});
    return;
  }
  for_each_chunk(param, grad, s, [&](auto* w, const auto* g, auto st, int64_t n) {
    using C = std::remove_pointer_t<decltype(w)>;
    if constexpr (std::is_same_v<C, float>) {
      const AdamF32 k{float(1 - lr * wd), float(wd), float(1 - b1), float(b2), float(1 - b2),
                      float(bias_correction2_sqrt), float(eps), float(step_size), decoupled, wd != 0};
      adam_f32(w, g, st[0], st[1], n, k);
      return;
    }
    const C c_decay = C(1 - lr * wd), c_wd = C(wd), c_1mb1 = C(1 - b1), c_b2 = C(b2), c_1mb2 = C(1 - b2);
    const C c_bc2 = C(bias_correction2_sqrt), c_eps = C(eps), c_step = C(step_size);
    C* m = st[0];
    C* v = st[1];
    for (int64_t i = 0; i < n; ++i) {
      C d = g[i];
      if (wd != 0) {
        if (decoupled) w[i] = w[i] * c_decay;
        else d = d + c_wd * w[i];
      }
      m[i] = m[i] + c_1mb1 * (d - m[i]);  // lerp(m, g, 1 - beta1), as PyTorch writes it
      v[i] = v[i] * c_b2 + c_1mb2 * d * d;
      const C denom = std::sqrt(v[i]) / c_bc2 + c_eps;
      w[i] = w[i] - c_step * (m[i] / denom);
    }
  });
}

}  // namespace mg
