// The two 16-bit float storage types, Half (IEEE fp16) and BFloat16, with round-to-nearest-even
// conversions from float. On the CPU they are storage only: kernels load them as float, compute
// in float and round on store (with F16C, f16 converts with the vcvtph2ps / vcvtps2ph
// instructions). MG_HOST_DEVICE lets the same code compile inside CUDA kernels.
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif

namespace mg {

MG_HOST_DEVICE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
MG_HOST_DEVICE float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  MG_HOST_DEVICE BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a float
  MG_HOST_DEVICE operator float() const { return bits_float(uint32_t(bits) << 16); }
  MG_HOST_DEVICE static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
    return uint16_t(u >> 16);
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  MG_HOST_DEVICE Half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a float
  MG_HOST_DEVICE operator float() const { return to_float(bits); }

  MG_HOST_DEVICE static float to_float(uint16_t h) {
#if defined(__F16C__) && !defined(__CUDACC__)
    return _cvtsh_ss(h);  // one vcvtph2ps: the same value as the bit code below, without branches
#endif
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
      if (man == 0) return bits_float(sign);
      // subnormal: value = man * 2^-24
      float f = float(man) * 5.9604644775390625e-8f;
      return sign ? -f : f;
    }
    if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
    return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
  }
  MG_HOST_DEVICE static uint16_t from_float(float f) {
#if defined(__F16C__) && !defined(__CUDACC__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);  // vcvtps2ph: IEEE round to nearest even
#endif
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);      // NaN
    if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);     // overflow (>= 65520) -> inf
    if (absu < 0x38800000u) {                                      // below 2^-14: subnormal or zero
      // value / 2^-24, rounded to nearest even, using float arithmetic (exact for this range)
      float a = bits_float(absu) * 16777216.0f;
      uint32_t m = uint32_t(a);
      float rem = a - float(m);
      if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
      return uint16_t(sign | m);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - (112u << 23);  // rebias and round
    return uint16_t(sign | (r >> 13));
  }
};

}  // namespace mg
