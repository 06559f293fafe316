// Which instruction set the int8 kernels (ops/int8_depthwise.h) run with, chosen at run time:
// the best the CPU has (AVX-512 VNNI with AVX-512BW, else AVX2 with FMA, else scalar), capped by
// the environment variable MG_INT8_ISA=vnni|avx2|scalar (to measure or test a lesser path on a
// better machine). Every path gives the same bits.
#pragma once

namespace mg {

enum class Int8Isa { scalar = 0, avx2 = 1, avx512vnni = 2 };

const char* int8_isa_name(Int8Isa isa);
// The best path this CPU supports.
Int8Isa int8_isa_supported();
// The path in use: int8_isa_supported() capped by MG_INT8_ISA (read once; an unknown value is an
// error naming the known ones) or by set_int8_isa.
Int8Isa int8_isa();
// Tests: use `isa` from now on (an error if the CPU lacks it); returns the previous choice.
Int8Isa set_int8_isa(Int8Isa isa);

}  // namespace mg
