// CPU element-wise loops: out[i] = f(a[i]) or f(a[i], b[i]) with a, b broadcast to out's shape
// by strides (no copies). Values are loaded in their compute type (float for f16/bf16), so one
// functor from ops/kernels serves every dtype. Contiguous operands take a flat loop the compiler
// vectorises; others walk rows with for_each_row. Parallel over fixed-size chunks.
// f16 / bf16 operands go through Note [16-bit blocks].
#pragma once
#include <algorithm>
#include <type_traits>

#include "core/half_convert.h"
#include "core/parallel.h"
#include "core/strided_loop.h"
#include "ops/op_utils.h"

namespace mg {

inline constexpr int64_t kElementwiseGrain = 32768;

template <class T>
inline T* typed_base(const Tensor& t) {
  return static_cast<T*>(t.storage()->data()) + t.storage_offset();
}

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Note [16-bit blocks]
// Converting f16 / bf16 one element at a time inside the loop (a NaN branch for bf16, a scalar
// vcvtps2ph for f16) keeps the loop scalar. When an operand or the output is 16-bit, the loops
// instead take blocks of kBlock elements: each 16-bit input is widened into a float buffer with
// convert_span (vectorised, bit-exact with the scalar conversions), the functor runs on floats
// (a loop the compiler vectorises), and a 16-bit output is rounded from a float buffer by
// convert_span. Same values in the same order, so the bits equal the element-wise path.
namespace detail {

inline constexpr int64_t kBlock = 256;  // 1 KiB float buffers per operand, on the stack

// n elements of p with stride st as compute-type values: p itself when contiguous and already
// in its compute type, else widened / gathered into buf.
template <class T>
inline const compute_t<T>* load_block(const T* p, int64_t st, int64_t n, compute_t<T>* buf) {
  if constexpr (is_16bit_float_v<T>) {
    if (st == 1) {
      convert_span(p, buf, n);
      return buf;
    }
  } else {
    if (st == 1) return p;
  }
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<compute_t<T>>(p[i * st]);
  return buf;
}

// o[i] = value(i) for i < n (o contiguous), rounding a 16-bit output through a float buffer.
template <class O, class G>
inline void store_block(O* o, int64_t n, G&& value) {
  if constexpr (is_16bit_float_v<O>) {
    float buf[kBlock];
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(value(i));
    convert_span(buf, o, n);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<O>(value(i));
  }
}

// o[0, n) = f(a[i * sa]): blocks of kBlock.
template <class O, class A, class F>
void map1_blocks(O* o, const A* a, int64_t sa, int64_t n, F& f) {
  compute_t<A> ba[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    int64_t m = std::min(kBlock, n - i0);
    const compute_t<A>* x = load_block(a + i0 * sa, sa, m, ba);
    store_block(o + i0, m, [&](int64_t i) { return f(x[i]); });
  }
}

template <class O, class A, class B, class F>
void map2_blocks(O* o, const A* a, int64_t sa, const B* b, int64_t sb, int64_t n, F& f) {
  compute_t<A> ba[kBlock];
  compute_t<B> bb[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    int64_t m = std::min(kBlock, n - i0);
    const compute_t<A>* x = load_block(a + i0 * sa, sa, m, ba);
    const compute_t<B>* y = load_block(b + i0 * sb, sb, m, bb);
    store_block(o + i0, m, [&](int64_t i) { return f(x[i], y[i]); });
  }
}

// c is passed as stored (the condition of where), a and b in their compute type.
template <class O, class C, class A, class B, class F>
void map3_blocks(O* o, const C* c, int64_t sc, const A* a, int64_t sa, const B* b, int64_t sb, int64_t n, F& f) {
  C bc[kBlock];
  compute_t<A> ba[kBlock];
  compute_t<B> bb[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    int64_t m = std::min(kBlock, n - i0);
    const C* w = c + i0 * sc;
    if (sc != 1) {
      for (int64_t i = 0; i < m; ++i) bc[i] = w[i * sc];
      w = bc;
    }
    const compute_t<A>* x = load_block(a + i0 * sa, sa, m, ba);
    const compute_t<B>* y = load_block(b + i0 * sb, sb, m, bb);
    store_block(o + i0, m, [&](int64_t i) { return f(w[i], x[i], y[i]); });
  }
}

}  // namespace detail

// out: contiguous, shape S; a: any strides, broadcastable to S.
template <class O, class A, class F>
void cpu_map1(const Tensor& out, const Tensor& a, F f) {
  if (skip_kernel(out)) return;
  O* o = typed_base<O>(out);
  const A* pa = typed_base<const A>(a);
  using CA = compute_t<A>;
  constexpr bool blocks = is_16bit_float_v<O> || is_16bit_float_v<A>;  // Note [16-bit blocks]
  if (a.is_contiguous() && a.shape() == out.shape()) {
    parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
      if constexpr (blocks) detail::map1_blocks(o + b, pa + b, 1, e - b, f);
      else for (int64_t i = b; i < e; ++i) o[i] = static_cast<O>(f(static_cast<CA>(pa[i])));
    });
    return;
  }
  const Shape& s = out.shape();
  Shape sa = broadcast_strides(a, s);
  Shape so = contiguous_strides(s);
  int64_t inner = s.empty() ? 1 : std::max<int64_t>(1, s.back());
  parallel_for(0, num_rows(s), std::max<int64_t>(1, kElementwiseGrain / inner), [&](int64_t rb, int64_t re) {
    for_each_row<2>(s, {so.data(), sa.data()}, {0, 0}, rb, re,
                    [&](const std::array<int64_t, 2>& off, int64_t len, const std::array<int64_t, 2>& st) {
                      O* po = o + off[0];
                      const A* q = pa + off[1];
                      if constexpr (blocks) detail::map1_blocks(po, q, st[1], len, f);
                      else for (int64_t i = 0; i < len; ++i) po[i] = static_cast<O>(f(static_cast<CA>(q[i * st[1]])));
                    });
  });
}

template <class O, class A, class B, class F>
void cpu_map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  if (skip_kernel(out)) return;
  O* o = typed_base<O>(out);
  const A* pa = typed_base<const A>(a);
  const B* pb = typed_base<const B>(b);
  using CA = compute_t<A>;
  using CB = compute_t<B>;
  constexpr bool blocks = is_16bit_float_v<O> || is_16bit_float_v<A> || is_16bit_float_v<B>;  // Note [16-bit blocks]
  if (a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() && b.shape() == out.shape()) {
    parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
      if constexpr (blocks) detail::map2_blocks(o + s, pa + s, 1, pb + s, 1, e - s, f);
      else for (int64_t i = s; i < e; ++i) o[i] = static_cast<O>(f(static_cast<CA>(pa[i]), static_cast<CB>(pb[i])));
    });
    return;
  }
  const Shape& s = out.shape();
  Shape sa = broadcast_strides(a, s);
  Shape sb = broadcast_strides(b, s);
  Shape so = contiguous_strides(s);
  int64_t inner = s.empty() ? 1 : std::max<int64_t>(1, s.back());
  parallel_for(0, num_rows(s), std::max<int64_t>(1, kElementwiseGrain / inner), [&](int64_t rb, int64_t re) {
    for_each_row<3>(s, {so.data(), sa.data(), sb.data()}, {0, 0, 0}, rb, re,
                    [&](const std::array<int64_t, 3>& off, int64_t len, const std::array<int64_t, 3>& st) {
                      O* po = o + off[0];
                      const A* qa = pa + off[1];
                      const B* qb = pb + off[2];
                      if constexpr (blocks) detail::map2_blocks(po, qa, st[1], qb, st[2], len, f);
                      else
                        for (int64_t i = 0; i < len; ++i)
                          po[i] = static_cast<O>(f(static_cast<CA>(qa[i * st[1]]), static_cast<CB>(qb[i * st[2]])));
                    });
  });
}

template <class O, class C, class A, class B, class F>
void cpu_map3(const Tensor& out, const Tensor& c, const Tensor& a, const Tensor& b, F f) {
  if (skip_kernel(out)) return;
  O* o = typed_base<O>(out);
  const C* pc = typed_base<const C>(c);
  const A* pa = typed_base<const A>(a);
  const B* pb = typed_base<const B>(b);
  const Shape& s = out.shape();
  Shape sc = broadcast_strides(c, s), sa = broadcast_strides(a, s), sb = broadcast_strides(b, s);
  Shape so = contiguous_strides(s);
  int64_t inner = s.empty() ? 1 : std::max<int64_t>(1, s.back());
  parallel_for(0, num_rows(s), std::max<int64_t>(1, kElementwiseGrain / inner), [&](int64_t rb, int64_t re) {
    for_each_row<4>(s, {so.data(), sc.data(), sa.data(), sb.data()}, {0, 0, 0, 0}, rb, re,
                    [&](const std::array<int64_t, 4>& off, int64_t len, const std::array<int64_t, 4>& st) {
                      if constexpr (is_16bit_float_v<O> || is_16bit_float_v<A> || is_16bit_float_v<B>) {
                        detail::map3_blocks(o + off[0], pc + off[1], st[1], pa + off[2], st[2], pb + off[3], st[3], len, f);
                        return;  // Note [16-bit blocks]
                      }
                      for (int64_t i = 0; i < len; ++i)
                        o[off[0] + i] = static_cast<O>(f(pc[off[1] + i * st[1]], static_cast<compute_t<A>>(pa[off[2] + i * st[2]]),
                                                         static_cast<compute_t<B>>(pb[off[3] + i * st[3]])));
                    });
  });
}

}  // namespace mg
