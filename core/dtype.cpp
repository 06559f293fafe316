// DType sizes, names and parsing.
#include "core/dtype.h"

namespace mg {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::b8: return 1;
  }
  MG_INTERNAL_ASSERT(false, "unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::b8: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == s) return t;
  if (s == "float32" || s == "float") return DType::f32;
  if (s == "float64" || s == "double") return DType::f64;
  if (s == "float16" || s == "half" || s == "fp16") return DType::f16;
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  MG_THROW("unknown dtype '", s, "' (expected one of f32 f64 f16 bf16 i8 u8 i32 i64 bool)");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
bool is_integral(DType t) {
  return t == DType::i8 || t == DType::u8 || t == DType::i32 || t == DType::i64;
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace mg
