// Element math shared by the CPU and CUDA backends: each functor maps compute-type values
// (float or double) to a value, with MG_HOST_DEVICE so one definition serves both. Backward
// functors take (dout, x) or (dout, y) and return dx. exp and tanh go through fn::exp / fn::tanh:
// on the host, float uses the vectorisable ops/kernels/vec_math.h (libm's scalar calls would keep
// the CPU loops from vectorising); double and CUDA device code use the standard functions.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/half.h"
#if !defined(__CUDACC__)
#include "ops/kernels/vec_math.h"
#endif

namespace mg::fn {

template <class T> MG_HOST_DEVICE T exp(T x) {
#if !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, float>) return vmath::exp_f(x);
#endif
  return std::exp(x);
}
template <class T> MG_HOST_DEVICE T tanh(T x) {
#if !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, float>) return vmath::tanh_f(x);
#endif
  return std::tanh(x);
}

#if !defined(__CUDACC__)
// sum over k < n of exp(x[k * st] - shift) in the compute type A, added in index order (the
// same bits as a plain loop of fn::exp): the exponentials run in blocks of 256, which vectorise,
// and only the sum is serial. Softmax, log-softmax, cross-entropy and attention rows use it.
template <class A, class T>
A exp_sum(const T* x, int64_t n, int64_t st, A shift) {
  constexpr int64_t kBlock = 256;
  A e[kBlock];
  A s = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = n - b < kBlock ? n - b : kBlock;
    for (int64_t k = 0; k < len; ++k) e[k] = exp(A(x[(b + k) * st]) - shift);
    for (int64_t k = 0; k < len; ++k) s += e[k];
  }
  return s;
}
#endif

// ---- forward, unary ----
struct Neg { template <class T> MG_HOST_DEVICE T operator()(T x) const { return -x; } };
struct Exp { template <class T> MG_HOST_DEVICE T operator()(T x) const { return fn::exp(x); } };
struct Log { template <class T> MG_HOST_DEVICE T operator()(T x) const { return std::log(x); } };
struct Sqrt { template <class T> MG_HOST_DEVICE T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <class T> MG_HOST_DEVICE T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Abs { template <class T> MG_HOST_DEVICE T operator()(T x) const { return x < T(0) ? -x : x; } };
struct Tanh { template <class T> MG_HOST_DEVICE T operator()(T x) const { return fn::tanh(x); } };
struct Sigmoid { template <class T> MG_HOST_DEVICE T operator()(T x) const { return T(1) / (T(1) + fn::exp(-x)); } };
struct Relu { template <class T> MG_HOST_DEVICE T operator()(T x) const { return x > T(0) ? x : T(0); } };
struct Relu6 {
  template <class T> MG_HOST_DEVICE T operator()(T x) const { return x < T(0) ? T(0) : (x > T(6) ? T(6) : x); }
};
// GPT-2's formula as written (as PyTorch computes it). x / (1 + e^{-2u}) is the same function
// with no cancellation for x < -3, but it moves bf16 results in that tail by a bf16 ulp often
// enough to change a bf16-pure training trajectory (tests/models/test_mixed_precision.cpp).
// GELU-tanh's t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), which its forward and backward share (one
// expression, so gelu_linear's backward can compute t once for both: ops/gelu_linear.cpp).
template <class T> MG_HOST_DEVICE T gelu_tanh_t(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2/pi)
  return fn::tanh(k * (x + T(0.044715) * x * x * x));
}
template <class T> MG_HOST_DEVICE T gelu_tanh_from_t(T x, T t) { return T(0.5) * x * (T(1) + t); }
// dx = g gelu'(x) given t = gelu_tanh_t(x).
template <class T> MG_HOST_DEVICE T gelu_tanh_grad_from_t(T g, T x, T t) {
  const T k = T(0.7978845608028654);
  T dt = k * (T(1) + T(3) * T(0.044715) * x * x) * (T(1) - t * t);
  return g * (T(0.5) * (T(1) + t) + T(0.5) * x * dt);
}
struct GeluTanh {
  template <class T> MG_HOST_DEVICE T operator()(T x) const {
    return gelu_tanh_from_t(x, gelu_tanh_t(x));
  }
};
struct Silu { template <class T> MG_HOST_DEVICE T operator()(T x) const { return x / (T(1) + fn::exp(-x)); } };

// ---- backward, unary: dx from (dout, x) ----
struct ExpBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T y) const { return g * y; } };  // from y
struct LogBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T x) const { return g / x; } };
struct SqrtBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T y) const { return g / (T(2) * y); } };  // from y
struct RsqrtBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T y) const { return T(-0.5) * g * y * y * y; } };  // from y
struct AbsBackward {
  template <class T> MG_HOST_DEVICE T operator()(T g, T x) const { return x > T(0) ? g : (x < T(0) ? -g : T(0)); }
};
struct TanhBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T y) const { return g * (T(1) - y * y); } };  // from y
struct SigmoidBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T y) const { return g * y * (T(1) - y); } };  // from y
struct ReluBackward { template <class T> MG_HOST_DEVICE T operator()(T g, T y) const { return y > T(0) ? g : T(0); } };  // from y
struct Relu6Backward {
  template <class T> MG_HOST_DEVICE T operator()(T g, T x) const { return (x > T(0) && x < T(6)) ? g : T(0); }
};
struct GeluTanhBackward {
  template <class T> MG_HOST_DEVICE T operator()(T g, T x) const {
    return gelu_tanh_grad_from_t(g, x, gelu_tanh_t(x));
  }
};
struct SiluBackward {
  template <class T> MG_HOST_DEVICE T operator()(T g, T x) const {
    T s = T(1) / (T(1) + fn::exp(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};

// ---- forward, binary ----
struct Add { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return a + b; } };
struct Sub { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return a - b; } };
struct Mul { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return a * b; } };
struct Div { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return a / b; } };
struct Pow { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return std::pow(a, b); } };
struct Maximum { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return a != a ? a : (a > b ? a : b); } };
struct Minimum { template <class T> MG_HOST_DEVICE T operator()(T a, T b) const { return a != a ? a : (a < b ? a : b); } };

// ---- comparisons ----
struct Eq { template <class T> MG_HOST_DEVICE bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <class T> MG_HOST_DEVICE bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <class T> MG_HOST_DEVICE bool operator()(T a, T b) const { return a < b; } };
struct Le { template <class T> MG_HOST_DEVICE bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <class T> MG_HOST_DEVICE bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <class T> MG_HOST_DEVICE bool operator()(T a, T b) const { return a >= b; } };

}  // namespace mg::fn
