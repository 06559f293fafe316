// The int8 kernels' run-time instruction-set choice (ops/int8_isa.h).
#include "ops/int8_isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mg {
namespace {

Int8Isa from_env() {
  Int8Isa best = int8_isa_supported();
  const char* env = std::getenv("MG_INT8_ISA");
  if (!env || !*env) return best;
  const std::string v(env);
  Int8Isa want;
  if (v == "vnni") want = Int8Isa::avx512vnni;
  else if (v == "avx2") want = Int8Isa::avx2;
  else if (v == "scalar") want = Int8Isa::scalar;
  else MG_THROW("MG_INT8_ISA='", v, "' is not known (known: vnni, avx2, scalar)");
  return int(want) < int(best) ? want : best;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{int(from_env())};
  return isa;
}

}  // namespace

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::avx512vnni: return "AVX-512 VNNI";
    case Int8Isa::avx2: return "AVX2";
    case Int8Isa::scalar: return "scalar";
  }
  return "?";
}

Int8Isa int8_isa_supported() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return Int8Isa::avx512vnni;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Int8Isa::avx2;
#endif
  return Int8Isa::scalar;
}

Int8Isa int8_isa() { return Int8Isa(current().load()); }

Int8Isa set_int8_isa(Int8Isa isa) {
  MG_CHECK(int(isa) <= int(int8_isa_supported()), "set_int8_isa: this CPU has no ", int8_isa_name(isa),
           " (best: ", int8_isa_name(int8_isa_supported()), ")");
  return Int8Isa(current().exchange(int(isa)));
}

}  // namespace mg
