// Branch-free float exp and tanh that GCC auto-vectorises (AVX2 / AVX-512 under -march=native):
// libm's expf / tanhf are scalar calls, so a loop that calls them runs one element at a time
// (a third of a GPT-mini step went to GELU-tanh through tanhf). Cody-Waite range reduction and
// Cephes polynomials; every special case (overflow, underflow, NaN, +-inf, -0) is a select, not a
// branch. Host only: the functors of elementwise_functors.h call CUDA's expf in device code.
// Accuracy against a double reference, tested in tests/ops/test_elementwise_fast.cpp: Note [vmath error].
#pragma once
#include <cstdint>

#include "core/half.h"  // float_bits, bits_float

namespace mg::vmath {

// Note [vmath error]
// Measured maximum error over every float in the tested ranges, against the double function of
// the same float input (tests/ops/test_elementwise_fast.cpp checks these bounds on a dense grid):
//   exp_f:  <= 1.01 ulp over all floats (subnormal results: within one subnormal step); x > 88.72
//           gives +inf, x < -104 gives +0, NaN gives NaN.
//   tanh_f: <= 1.33 ulp over all floats; tanh(+-0) = +-0, tanh(+-inf) = +-1, NaN gives NaN.
// (Measured once over all 2^32 floats; the test checks 2 ulp on a dense grid.)

inline float exp_f(float x) {
  // e^x = 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]. Clamping x to
  // [-104, 89] keeps n in [-150, 129]; NaN fails both comparisons and flows through as NaN.
  float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
  float t = xc * 1.44269504088896341f + magic;
  float n = t - magic;
  int32_t ni = int32_t(float_bits(t) - float_bits(magic));  // n as an integer, no float->int conversion
  // ln 2 = C1 + C2 with C1 = 355/512: n * C1 is exact, so r carries the full precision of x.
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;  // Cephes expf minimax polynomial for e^r on [-ln2/2, ln2/2]
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n as 2^n1 * 2^n2 with n1, n2 in [-75, 65]: both are normal floats, so results that overflow
  // become inf and results in the subnormal range round once, in the last multiply.
  int32_t n1 = ni >> 1;
  int32_t n2 = ni - n1;
  float s1 = bits_float(uint32_t(n1 + 127) << 23);
  float s2 = bits_float(uint32_t(n2 + 127) << 23);
  return p * s1 * s2;
}

inline float tanh_f(float x) {
  // tanh is odd: work on a = |x| and put x's sign back at the end (so tanh(-0) = -0).
  uint32_t sign = float_bits(x) & 0x80000000u;
  float a = bits_float(float_bits(x) & 0x7fffffffu);
  // a < 0.625: tanh(a) = a + a^3 P(a^2) (Cephes tanhf minimax polynomial); tiny a gives a exactly.
  float z = a * a;
  float q = -5.70498872745e-3f;
  q = q * z + 2.06390887954e-2f;
  q = q * z - 5.37397155531e-2f;
  q = q * z + 1.33314422036e-1f;
  q = q * z - 3.33332819422e-1f;
  float small = q * z * a + a;
  // a >= 0.625: tanh(a) = 1 - 2 / (e^{2a} + 1), no cancellation since the result is >= 0.55.
  // a is clamped at 20 (tanh rounds to 1 well before) so e^{2a} stays finite; inf gives 1.
  float ac = a > 20.0f ? 20.0f : a;
  float big = 1.0f - 2.0f / (exp_f(2.0f * ac) + 1.0f);
  float r = a < 0.625f ? small : big;  // NaN: a < 0.625 is false, and big is NaN
  return bits_float(float_bits(r) | sign);
}

}  // namespace mg::vmath
