// Small dense products on flash attention's tiles (ops/flash_attention.cpp): C (M x N) = or +=
// A (M x K) B (K x N), A read one element at a time at any row and column strides (so a tile or
// its transpose serves without a copy), B and C row-major. The tiles are at most 64 x 64 x 64 and
// live in L1, so nothing is packed: a register tile of up to kRows rows by kMaxVecs vectors of C
// stays in registers over all of k, each B row is loaded once per register tile and each A value
// broadcast. Every element of C is summed over k in order by multiply-adds (contracted to FMAs),
// whatever the vector width, so AVX-512 and AVX2 builds give the same bits. Attention's tiles
// are memgrad's own arithmetic (not a GEMM whose order the losses were pinned with), which is why
// they need none of cpu_gemm's machinery (Note [Eigen's summation order]).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mg::attention_tiles {

#if defined(__AVX512F__)
inline constexpr int kVecBytes = 64, kMaxVecs = 4;  // 6 x 4 zmm accumulators: 64 columns of f32
#else
inline constexpr int kVecBytes = 32, kMaxVecs = 2;  // 6 x 2 ymm accumulators (16 registers in all)
#endif
inline constexpr int kRows = 6;

template <class T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};
template <class T>
using Vec = typename VecOf<T>::type;
template <class T>
inline constexpr int64_t kLanes = kVecBytes / int64_t(sizeof(T));

struct Strides {
  int64_t a_row, a_col;  // A(m, k) = a[m * a_row + k * a_col]
  int64_t ldb, ldc;
};

// C rows [0, R) x columns [0, NV vectors) over all of k.
template <class T, int R, int NV>
inline void register_tile(int64_t K, const T* a, const T* b, T* c, const Strides& s, bool accumulate) {
  using V = Vec<T>;
  constexpr int64_t W = kLanes<T>;
  V acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (accumulate) std::memcpy(&acc[r][v], c + r * s.ldc + v * W, sizeof(V));
      else acc[r][v] = V{};
    }
  for (int64_t k = 0; k < K; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + k * s.ldb + v * W, sizeof(V));
    const T* ak = a + k * s.a_col;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const T ar = ak[r * s.a_row];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(c + r * s.ldc + v * W, &acc[r][v], sizeof(V));
}

// Columns [0, NV vectors) of C, all M rows, kRows at a time.
template <class T, int NV>
inline void column_strip(int64_t M, int64_t K, const T* a, const T* b, T* c, const Strides& s, bool accumulate) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows) register_tile<T, kRows, NV>(K, a + m * s.a_row, b, c + m * s.ldc, s, accumulate);
  const T* am = a + m * s.a_row;
  T* cm = c + m * s.ldc;
  switch (M - m) {
    case 5: register_tile<T, 5, NV>(K, am, b, cm, s, accumulate); break;
    case 4: register_tile<T, 4, NV>(K, am, b, cm, s, accumulate); break;
    case 3: register_tile<T, 3, NV>(K, am, b, cm, s, accumulate); break;
    case 2: register_tile<T, 2, NV>(K, am, b, cm, s, accumulate); break;
    case 1: register_tile<T, 1, NV>(K, am, b, cm, s, accumulate); break;
    default: break;
  }
}

// C = A B (accumulate false) or C += A B (true); M, N, K >= 0.
template <class T>
void tile_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t ldb,
               T* c, int64_t ldc, bool accumulate) {
  const Strides s{a_row, a_col, ldb, ldc};
  constexpr int64_t W = kLanes<T>;
  int64_t n = 0;
  for (; n + kMaxVecs * W <= N; n += kMaxVecs * W) column_strip<T, kMaxVecs>(M, K, a, b + n, c + n, s, accumulate);
  if constexpr (kMaxVecs >= 4)
    for (; n + 2 * W <= N; n += 2 * W) column_strip<T, 2>(M, K, a, b + n, c + n, s, accumulate);
  for (; n + W <= N; n += W) column_strip<T, 1>(M, K, a, b + n, c + n, s, accumulate);
  for (; n < N; ++n)  // the last columns, fewer than a vector: one at a time, in the same order
    for (int64_t m = 0; m < M; ++m) {
      T acc = accumulate ? c[m * ldc + n] : T(0);
      for (int64_t k = 0; k < K; ++k) acc += a[m * a_row + k * a_col] * b[k * ldb + n];
      c[m * ldc + n] = acc;
    }
}

}  // namespace mg::attention_tiles
