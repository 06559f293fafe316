// Vectorised conversions between f32 and the 16-bit float types over contiguous spans: what
// copy_/cast and the 16-bit GEMM's panel packing run. bf16 uses integer bit tricks on AVX-512 or
// AVX2 lanes (the same round-to-nearest-even and quiet-NaN rule as BFloat16::from_float, bit
// for bit); f16 uses the F16C / AVX-512 vcvtph2ps / vcvtps2ph instructions (IEEE round to nearest
// even, like Half::from_float). Without those ISA extensions the scalar conversions run.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace mg {

void convert_span(const BFloat16* src, float* dst, int64_t n);
void convert_span(const Half* src, float* dst, int64_t n);
void convert_span(const float* src, BFloat16* dst, int64_t n);
void convert_span(const float* src, Half* dst, int64_t n);

// A rows x cols block with leading dimensions (row-major): dst[r * ldd + c] = src[r * lds + c].
template <class S, class D>
void convert_block(const S* src, int64_t lds, D* dst, int64_t ldd, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) convert_span(src + r * lds, dst + r * ldd, cols);
}

// Which instructions the conversions use here ("AVX-512 (bf16 bit tricks, f16 vcvtph2ps)", ...).
const char* half_convert_isa();

}  // namespace mg
