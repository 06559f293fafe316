// bf16 products on Intel AMX (Sapphire Rapids and later): TDPBF16PS multiplies a 16 x 32 bf16
// tile by a 32 x 16 one into a 16 x 16 f32 tile, 8192 multiply-adds per instruction where
// vdpbf16ps does 32 and an f32 FMA 16. One tile of cpu_gemm's 16-bit grid at a time, like
// ops/cpu_gemm_bf16.cpp (the same tiles and workspace lanes, so results do not depend on the
// thread count): op(A)'s rows are packed row-major with K padded to 32, op(B)'s columns as pairs of
// consecutive k in slivers of 16 columns (AMX's "VNNI" layout: one 32-bit word per column per pair),
// both zero-padded to multiples of 32 rows and columns; 2 x 2 accumulator tiles sum all of K in f32
// (in k order, each product of two bf16 exact in f32), and the tile is rounded to bf16 on store.
// Linux hands AMX's 8 KiB of tile registers to a process only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM), made once by amx_bf16_supported(). tests/ops/test_cpu_gemm_amx.cpp bounds the
// results against f64 and against the vdpbf16ps path.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/half_convert.h"
#include "ops/cpu_gemm_packed.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MG_AMX __attribute__((target("amx-tile,amx-bf16")))

namespace mg::gemm_packed {
namespace {

constexpr int64_t kTile = 16;   // rows of a tile, and f32 columns of an accumulator tile
constexpr int64_t kStep = 32;   // k per TDPBF16PS (64 bytes of bf16 per row)
constexpr int64_t kBlock = 32;  // rows and columns of the 2 x 2 accumulator tiles

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The CPU has AMX-TILE and AMX-BF16, the OS saves tile state (XCR0 bits 17 and 18), and Linux
// granted this process the tile data.
bool request_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE: xgetbv is allowed
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3) != 3) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

std::atomic<bool>& allowed() {
  static std::atomic<bool> a{true};
  return a;
}

// The tile configuration: every tile 16 rows of 64 bytes (C: 16 f32, A: 32 bf16, B: 16 pairs).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// op(A) (rows, K) as (r32, k32) bf16, row-major, zero past rows and K; op(A)(i, k) is
// A[i * lda + k] or, transposed, A[k * lda + i] (copied in 16 x 16 blocks: both sides stay in cache).
void pack_a(Transpose ta, const uint16_t* A, int64_t lda, int64_t rows, int64_t K, int64_t r32, int64_t k32,
            uint16_t* pa) {
  std::fill(pa, pa + r32 * k32, uint16_t(0));
  if (ta == Transpose::no) {
    for (int64_t i = 0; i < rows; ++i) std::memcpy(pa + i * k32, A + i * lda, size_t(K) * 2);
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += kTile)
    for (int64_t i0 = 0; i0 < rows; i0 += kTile)
      for (int64_t k = k0; k < std::min(K, k0 + kTile); ++k)
        for (int64_t i = i0; i < std::min(rows, i0 + kTile); ++i) pa[i * k32 + k] = A[k * lda + i];
}

// op(B) (K, cols) as c32 / 16 slivers of (kp, 16) words, word (p, l) of sliver s = op(B)(2p, j)
// (low half) and op(B)(2p + 1, j) (high half) for column j = 16 s + l, zero past cols and K.
// op(B)(k, j) is B[k * ldb + j] (two stored rows make a row of words) or, transposed,
// B[j * ldb + k] (a pair is one 32-bit word of a stored row).
void pack_b(Transpose tb, const uint16_t* B, int64_t ldb, int64_t cols, int64_t K, int64_t c32, int64_t kp,
            uint32_t* pb) {
  std::fill(pb, pb + c32 * kp, 0u);
  auto word = [&](int64_t p, int64_t j) -> uint32_t& { return pb[(j / kTile) * kp * kTile + p * kTile + j % kTile]; };
  if (tb == Transpose::no) {
    for (int64_t p = 0; 2 * p < K; ++p) {
      const uint16_t* lo = B + 2 * p * ldb;
      const uint16_t* hi = 2 * p + 1 < K ? lo + ldb : nullptr;
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        uint32_t* dst = &word(p, j0);
        const int64_t n = std::min(kTile, cols - j0);
        if (hi)
          for (int64_t l = 0; l < n; ++l) dst[l] = uint32_t(lo[j0 + l]) | uint32_t(hi[j0 + l]) << 16;
        else
          for (int64_t l = 0; l < n; ++l) dst[l] = lo[j0 + l];
      }
    }
    return;
  }
  const int64_t full = K / 2;  // pairs with both halves inside K
  for (int64_t j = 0; j < cols; ++j) {
    const uint16_t* col = B + j * ldb;
    uint32_t* dst = &word(0, j);
    for (int64_t p = 0; p < full; ++p) {
      uint32_t w;
      std::memcpy(&w, col + 2 * p, sizeof w);
      dst[p * kTile] = w;
    }
    if (K % 2) dst[full * kTile] = col[K - 1];
  }
}

// C tiles 0-3 (2 x 2 over rows i, i + 16 and columns j, j + 16), A tiles 4-5, B tiles 6-7.
MG_AMX void block(int64_t k32, const uint16_t* pa, int64_t a_stride, const uint32_t* pb0, const uint32_t* pb1,
                  float* pc, int64_t c_stride) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < k32; k += kStep) {
    _tile_loadd(4, pa + k, a_stride);
    _tile_loadd(5, pa + kTile * (a_stride / 2) + k, a_stride);
    _tile_loadd(6, pb0 + (k / 2) * kTile, kTile * 4);
    _tile_loadd(7, pb1 + (k / 2) * kTile, kTile * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, pc, c_stride);
  _tile_stored(1, pc + kTile, c_stride);
  _tile_stored(2, pc + kTile * (c_stride / 4), c_stride);
  _tile_stored(3, pc + kTile * (c_stride / 4) + kTile, c_stride);
}

MG_AMX void load_config(const TileConfig& cfg) { _tile_loadconfig(&cfg); }
MG_AMX void release_tiles() { _tile_release(); }

}  // namespace

bool amx_bf16_supported() {
  static const bool has = request_amx();
  return has && allowed().load(std::memory_order_relaxed);
}

void set_amx_bf16_allowed(bool on) { allowed().store(on, std::memory_order_relaxed); }

int64_t amx_bf16_workspace_floats(int64_t rows, int64_t cols, int64_t K) {
  const int64_t r = round_up(rows, kBlock), c = round_up(cols, kBlock), k = round_up(K, kStep);
  return r * k / 2 + c * k / 2 + r * c + 16;  // + 16: room to align the packs to 64 bytes
}

void amx_bf16_gemm(Transpose ta, Transpose tb, int64_t rows, int64_t cols, int64_t K, float alpha,
                   const BFloat16* A, int64_t lda, const BFloat16* B, int64_t ldb, float beta, BFloat16* C,
                   int64_t ldc, float* ws) {
  const int64_t r32 = round_up(rows, kBlock), c32 = round_up(cols, kBlock), k32 = round_up(K, kStep), kp = k32 / 2;
  auto* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(ws) + 63) / 64 * 64);
  uint16_t* pa = reinterpret_cast<uint16_t*>(base);           // (r32, k32) bf16, row-major
  uint32_t* pb = reinterpret_cast<uint32_t*>(base + r32 * k32 / 2);  // c32 / 16 slivers of (kp, 16) words
  float* pc = base + r32 * k32 / 2 + c32 * kp;                // (r32, c32) f32
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(A);
  const uint16_t* b16 = reinterpret_cast<const uint16_t*>(B);
  pack_a(ta, a16, lda, rows, K, r32, k32, pa);
  pack_b(tb, b16, ldb, cols, K, c32, kp, pb);
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = uint8_t(kTile);
    cfg.colsb[t] = 64;
  }
  load_config(cfg);
  for (int64_t i = 0; i < r32; i += kBlock)
    for (int64_t j = 0; j < c32; j += kBlock)
      block(k32, pa + i * k32, k32 * 2, pb + (j / kTile) * kp * kTile, pb + (j / kTile + 1) * kp * kTile,
            pc + i * c32 + j, c32 * 4);
  release_tiles();
  // c = alpha acc (+ beta c), rounded to bf16: the vdpbf16ps path's epilogue.
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float r = alpha * pc[i * c32 + j];
      if (beta != 0.0f) r = std::fma(beta, float(C[i * ldc + j]), r);
      C[i * ldc + j] = BFloat16(r);
    }
}

}  // namespace mg::gemm_packed

#else  // not x86-64 Linux with GCC or clang: no AMX

namespace mg::gemm_packed {
bool amx_bf16_supported() { return false; }
void set_amx_bf16_allowed(bool) {}
int64_t amx_bf16_workspace_floats(int64_t, int64_t, int64_t) { return 0; }
void amx_bf16_gemm(Transpose, Transpose, int64_t, int64_t, int64_t, float, const BFloat16*, int64_t, const BFloat16*,
                   int64_t, float, BFloat16*, int64_t, float*) {}
}  // namespace mg::gemm_packed

#endif
