// DType: the element types a tensor can hold, their sizes and names, and the dispatch macros that
// turn a runtime dtype into a compile-time `scalar_t` inside a kernel. f16/bf16 are storage
// types: `compute_t<T>` is the type kernels do arithmetic in (float for the 16-bit types).
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "core/half.h"

namespace mg {

enum class DType : uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64, b8 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i8,
                                       DType::u8,  DType::i32, DType::i64, DType::b8};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", "bool", ...
DType parse_dtype(std::string_view s);  // inverse of dtype_name; throws mg::Error naming s
bool is_floating(DType t);              // f32 f64 f16 bf16
bool is_integral(DType t);              // i8 u8 i32 i64 (not bool)
std::ostream& operator<<(std::ostream& os, DType t);

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };
template <typename T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

// The type arithmetic is done in: float for the 16-bit floats, the type itself otherwise.
template <typename T> struct compute_type { using type = T; };
template <> struct compute_type<Half> { using type = float; };
template <> struct compute_type<BFloat16> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

// Converts between any two element types through their compute types (bool: x != 0).
template <typename D, typename S>
MG_HOST_DEVICE D convert_scalar(S x) {
  if constexpr (std::is_same_v<D, S>) return x;
  else if constexpr (std::is_same_v<D, bool>) return static_cast<compute_t<S>>(x) != compute_t<S>(0);
  else return D(static_cast<compute_t<D>>(static_cast<compute_t<S>>(x)));
}

}  // namespace mg

#define MG_DTYPE_CASE(enum_val, type, ...) \
  case ::mg::DType::enum_val: {            \
    using scalar_t = type;                 \
    return __VA_ARGS__();                  \
  }

// MG_DISPATCH_FLOAT(dtype, "op", [&] { kernel<scalar_t>(...); }) for f32 f64 f16 bf16.
#define MG_DISPATCH_FLOAT(dt, opname, ...)                                                  \
  [&] {                                                                                     \
    switch (dt) {                                                                           \
      MG_DTYPE_CASE(f32, float, __VA_ARGS__)                                                \
      MG_DTYPE_CASE(f64, double, __VA_ARGS__)                                               \
      MG_DTYPE_CASE(f16, ::mg::Half, __VA_ARGS__)                                           \
      MG_DTYPE_CASE(bf16, ::mg::BFloat16, __VA_ARGS__)                                      \
      default:                                                                              \
        MG_THROW(opname, ": dtype ", dt, " is not supported (expected f32, f64, f16 or bf16)"); \
    }                                                                                       \
  }()

// Every dtype, bool included.
#define MG_DISPATCH_ALL(dt, opname, ...)                      \
  [&] {                                                       \
    switch (dt) {                                             \
      MG_DTYPE_CASE(f32, float, __VA_ARGS__)                  \
      MG_DTYPE_CASE(f64, double, __VA_ARGS__)                 \
      MG_DTYPE_CASE(f16, ::mg::Half, __VA_ARGS__)             \
      MG_DTYPE_CASE(bf16, ::mg::BFloat16, __VA_ARGS__)        \
      MG_DTYPE_CASE(i8, int8_t, __VA_ARGS__)                  \
      MG_DTYPE_CASE(u8, uint8_t, __VA_ARGS__)                 \
      MG_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                \
      MG_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                \
      MG_DTYPE_CASE(b8, bool, __VA_ARGS__)                    \
      default:                                                \
        MG_THROW(opname, ": unknown dtype");                  \
    }                                                         \
  }()

// Numeric dtypes (everything but bool).
#define MG_DISPATCH_NUMERIC(dt, opname, ...)                                     \
  [&] {                                                                          \
    switch (dt) {                                                                \
      MG_DTYPE_CASE(f32, float, __VA_ARGS__)                                     \
      MG_DTYPE_CASE(f64, double, __VA_ARGS__)                                    \
      MG_DTYPE_CASE(f16, ::mg::Half, __VA_ARGS__)                                \
      MG_DTYPE_CASE(bf16, ::mg::BFloat16, __VA_ARGS__)                           \
      MG_DTYPE_CASE(i8, int8_t, __VA_ARGS__)                                     \
      MG_DTYPE_CASE(u8, uint8_t, __VA_ARGS__)                                    \
      MG_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                                   \
      MG_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                                   \
      default:                                                                   \
        MG_THROW(opname, ": dtype ", dt, " is not supported (bool is not numeric)"); \
    }                                                                            \
  }()

// Index dtypes for embedding / cross-entropy targets / gather.
#define MG_DISPATCH_INDEX(dt, opname, ...)                                            \
  [&] {                                                                               \
    switch (dt) {                                                                     \
      MG_DTYPE_CASE(i32, int32_t, __VA_ARGS__)                                        \
      MG_DTYPE_CASE(i64, int64_t, __VA_ARGS__)                                        \
      default:                                                                        \
        MG_THROW(opname, ": index dtype ", dt, " is not supported (expected i32 or i64)"); \
    }                                                                                 \
  }()
