// CPU element-wise loops: out[i] = f(a[i]) or f(a[i], b[i]) with a, b broadcast to out's shape
// by strides (no copies). Values are loaded in their compute type (float for f16/bf16), so one
// functor from ops/kernels serves every dtype. Contiguous operands take a flat loop the compiler
// vectorises; others walk rows with for_each_row. Parallel over fixed-size chunks.
#pragma once
#include <algorithm>

#include "core/parallel.h"
#include "core/strided_loop.h"
#include "ops/op_utils.h"

namespace mg {

inline constexpr int64_t kElementwiseGrain = 32768;

template <class T>
inline T* typed_base(const Tensor& t) {
  return static_cast<T*>(t.storage()->data()) + t.storage_offset();
}

// out: contiguous, shape S; a: any strides, broadcastable to S.
template <class O, class A, class F>
void cpu_map1(const Tensor& out, const Tensor& a, F f) {
  if (skip_kernel(out)) return;
  O* o = typed_base<O>(out);
  const A* pa = typed_base<const A>(a);
  using CA = compute_t<A>;
  if (a.is_contiguous() && a.shape() == out.shape()) {
    parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = static_cast<O>(f(static_cast<CA>(pa[i])));
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
                      for (int64_t i = 0; i < len; ++i) po[i] = static_cast<O>(f(static_cast<CA>(q[i * st[1]])));
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
  if (a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() && b.shape() == out.shape()) {
    parallel_for(0, out.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) o[i] = static_cast<O>(f(static_cast<CA>(pa[i]), static_cast<CB>(pb[i])));
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
                      for (int64_t i = 0; i < len; ++i)
                        o[off[0] + i] = static_cast<O>(f(pc[off[1] + i * st[1]], static_cast<compute_t<A>>(pa[off[2] + i * st[2]]),
                                                         static_cast<compute_t<B>>(pb[off[3] + i * st[3]])));
                    });
  });
}

}  // namespace mg
