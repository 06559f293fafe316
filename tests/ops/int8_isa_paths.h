// Test helper: run a test case once per int8 kernel path this CPU has (ops/int8_isa.h), so the
// AVX-512 VNNI, AVX2 and scalar paths are all checked on one machine. Use at the top of a case:
//   MG_FOR_EACH_INT8_ISA();
// which regenerates the case for each path (Catch GENERATE) and restores the choice afterwards.
#pragma once
#include <catch2/catch.hpp>

#include "ops/int8_isa.h"

namespace mg::test {

struct Int8IsaScope {
  explicit Int8IsaScope(Int8Isa isa) : previous(set_int8_isa(isa)) {}
  ~Int8IsaScope() { set_int8_isa(previous); }
  Int8Isa previous;
};

}  // namespace mg::test

#define MG_FOR_EACH_INT8_ISA()                                                                               \
  const ::mg::Int8Isa mg_isa_ = GENERATE(::mg::Int8Isa::scalar, ::mg::Int8Isa::avx2, ::mg::Int8Isa::avx512vnni); \
  if (int(mg_isa_) > int(::mg::int8_isa_supported())) return; /* not on this CPU */                          \
  ::mg::test::Int8IsaScope mg_isa_scope_(mg_isa_);                                                           \
  INFO("int8 path " << ::mg::int8_isa_name(mg_isa_))
