// The int8 GEMM of ops/int8_gemm.h on CUDA: C(M, N) = A(M, K) · (B(K, N) − zb) with A s8 weights
// (row-major), B u8 activations (or f32 quantized on the way in with quantize_u8) in any
// Int8Layout, int32 sums with __dp4a-style byte dot products (sm_61+), then the CPU's epilogue
// functions (ops/int8_requant.h, MG_HOST_DEVICE): c − zb·rowsum(A) as i32, or requantized to f32
// (row scale, bias, clamp) or u8. Integer sums are exact and the epilogue is the same code, so
// every output equals the CPU path bit for bit.
// Tiling: a block of 16x16 threads owns a 64x64 tile of C, each thread 4x4 outputs strided by 16
// (rows ty + 16i, columns tx + 16j: conflict-free shared reads, coalesced stores). K goes in
// chunks of 32: the block stages A (64 rows) and B (64 columns) as words of 4 consecutive k
// bytes in shared memory, zero past M, N and K, so any K (not a multiple of 4) works.
#include "core/cuda/context.h"
#include "ops/cuda/int8_launchers.h"

namespace mg::cuda {
namespace {

constexpr int kTile = 64;             // rows and columns of C per block
constexpr int kWordsK = 8;            // 4-byte words of k per stage (32 k values)
constexpr int kThreadsSide = 16;      // 16 x 16 threads
constexpr int kPer = kTile / kThreadsSide;  // 4 outputs per thread per dimension
constexpr int kSumThreads = 256;

struct GemmArgs {
  int64_t M, N, K;
  const int8_t* a;
  const int32_t* row_sums;
  const uint8_t* b_u8;  // or null: then b_f32, quantized with inv_scale and b_zero
  const float* b_f32;
  Int8Layout b_layout;
  float inv_scale;
  int32_t b_zero;
  Int8GemmOut out;
};

// c + the dot product of four s8 (a) and four u8 (b) bytes, exact in int32.
__device__ __forceinline__ int32_t dp4a_s8u8(int32_t a, uint32_t b, int32_t c) {
  int32_t d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Word `kw` of A's row m from k0: bytes A[m][k0 + 4kw + g], g < 4 (0 past M or K).
__device__ __forceinline__ int32_t a_word(const GemmArgs& p, int64_t m, int64_t k) {
  uint32_t w = 0;
  for (int g = 0; g < 4; ++g)
    if (m < p.M && k + g < p.K) w |= uint32_t(uint8_t(p.a[m * p.K + k + g])) << (8 * g);
  return int32_t(w);
}

// B's values (k .. k+3, n) as one word of 4 u8 (0 past N or K).
__device__ __forceinline__ uint32_t b_word(const GemmArgs& p, int64_t k, int64_t n) {
  uint32_t w = 0;
  if (n >= p.N) return 0;
  for (int g = 0; g < 4; ++g) {
    if (k + g >= p.K) break;
    const int64_t at = p.b_layout.offset(k + g, n);
    const uint8_t v = p.b_u8 ? p.b_u8[at] : quantize_u8(p.b_f32[at], p.inv_scale, p.b_zero);
    w |= uint32_t(v) << (8 * g);
  }
  return w;
}

__device__ __forceinline__ void store(const GemmArgs& p, int64_t m, int64_t n, int32_t acc) {
  const Int8GemmOut& o = p.out;
  const int32_t c = acc - p.b_zero * p.row_sums[m];  // the zero point folded in, as the CPU's epilogue
  const int64_t at = o.layout.offset(m, n);
  if (o.i32) {
    o.i32[at] = c;
    return;
  }
  const Requant q{.scale = o.row_scale[m], .bias = o.bias ? o.bias[m] : 0.f, .lo = o.clamp_lo, .hi = o.clamp_hi,
                  .out_inv_scale = o.out_inv_scale, .out_zero = o.out_zero};
  if (o.f32) o.f32[at] = q.f32(c);
  else o.u8[at] = q.u8(c);
}

__global__ void __launch_bounds__(kThreadsSide* kThreadsSide) int8_gemm_kernel(const GemmArgs p) {
  __shared__ int32_t as[kWordsK][kTile];   // [k word][row]
  __shared__ uint32_t bs[kWordsK][kTile];  // [k word][column]
  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * kThreadsSide + tx;
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  // With k contiguous in B (a Linear's x (rows, K)), neighbour threads take neighbour k words.
  const bool b_k_inner = p.b_layout.row_stride == 1;
  int32_t acc[kPer][kPer] = {};
  for (int64_t k0 = 0; k0 < p.K; k0 += 4 * kWordsK) {
    for (int i = t; i < kWordsK * kTile; i += kThreadsSide * kThreadsSide) {
      const int aw = i % kWordsK, ar = i / kWordsK;  // 8 threads read one row's 32 bytes
      as[aw][ar] = a_word(p, m0 + ar, k0 + 4 * aw);
      const int bw = b_k_inner ? i % kWordsK : i / kTile, bc = b_k_inner ? i / kWordsK : i % kTile;
      bs[bw][bc] = b_word(p, k0 + 4 * bw, n0 + bc);
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWordsK; ++w) {
      int32_t a[kPer];
      uint32_t b[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) a[i] = as[w][ty + kThreadsSide * i], b[i] = bs[w][tx + kThreadsSide * i];
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) acc[i][j] = dp4a_s8u8(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < kPer; ++i)
    for (int j = 0; j < kPer; ++j) {
      const int64_t m = m0 + ty + kThreadsSide * i, n = n0 + tx + kThreadsSide * j;
      if (m < p.M && n < p.N) store(p, m, n, acc[i][j]);
    }
}

__global__ void row_sums_kernel(const int8_t* a, int64_t M, int64_t K, int32_t* sums) {
  const int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (m >= M) return;
  int32_t s = 0;
  for (int64_t k = 0; k < K; ++k) s += a[m * K + k];
  sums[m] = s;
}

}  // namespace

void int8_row_sums(int device, const int8_t* a, int64_t M, int64_t K, int32_t* sums) {
  if (M == 0) return;
  DeviceGuard g(device);
  row_sums_kernel<<<unsigned((M + kSumThreads - 1) / kSumThreads), kSumThreads, 0, stream(device)>>>(a, M, K, sums);
  MG_CUDA_CHECK_LAUNCH("int8 row_sums_kernel");
}

void int8_gemm(int device, int64_t M, int64_t N, int64_t K, const int8_t* a, const int32_t* row_sums,
               const uint8_t* b_u8, const float* b_f32, const Int8Layout& b_layout, float inv_scale, int32_t b_zero,
               const Int8GemmOut& out) {
  if (M == 0 || N == 0) return;
  const int64_t grid_n = (N + kTile - 1) / kTile, grid_m = (M + kTile - 1) / kTile;
  MG_CHECK(grid_m <= 65535 && grid_n <= int64_t(1) << 31, "int8_gemm on cuda: ", M, " x ", N, " is too large");
  DeviceGuard g(device);
  const GemmArgs p{.M = M, .N = N, .K = K, .a = a, .row_sums = row_sums, .b_u8 = b_u8, .b_f32 = b_f32,
                   .b_layout = b_layout, .inv_scale = inv_scale, .b_zero = b_zero, .out = out};
  const dim3 grid{unsigned(grid_n), unsigned(grid_m)}, block{kThreadsSide, kThreadsSide};
  int8_gemm_kernel<<<grid, block, 0, stream(device)>>>(p);
  MG_CUDA_CHECK_LAUNCH("int8_gemm_kernel");
}

}  // namespace mg::cuda
