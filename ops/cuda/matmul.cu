// CUDA matrix products on cuBLAS: out (batch..., N, M) = a b (+ bias on every row). Row-major
// tensors are handed to column-major cuBLAS as C^T = B^T A^T, so a row-major operand is used
// as-is and a transposed view is passed with op T, never copied. One GEMM when b is shared and
// a's rows are evenly spaced (linear on (B, T, C) inputs), a strided-batched GEMM when each
// operand's batch offsets are i * stride (attention), pointer arrays otherwise. f16/bf16 use
// tensor cores with f32 accumulation; f32 uses TF32 only when allow_tf32(). cuBLAS works in a
// workspace tensor from the caching allocator (category workspace), never its own cudaMalloc.
#include <optional>

#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/gemm.h"
#include "ops/gemm_view.h"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

using gemm::batch_offset;
using gemm::batch_strides;
using gemm::flat_row_stride;
using gemm::gemm_view;
using gemm::GemmView;
using gemm::linear_batch_stride;

struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  bool f64;
};

GemmTypes gemm_types(DType t) {
  switch (t) {
    case DType::f32: return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, false};
    case DType::f64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, true};
    case DType::f16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, false};
    case DType::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false};
    default: MG_THROW("matmul: dtype ", t, " is not supported on CUDA (expected f32, f64, f16 or bf16)");
  }
}

int as_int(int64_t v, const char* what) {
  MG_CHECK(v >= 0 && v < (int64_t(1) << 31), "matmul: ", what, " = ", v, " is too large for one cuBLAS call");
  return int(v);
}

// cuBLAS's workspace for one call, from the caching allocator: 32 MiB on Hopper and later, 4 MiB
// before (as PyTorch). Under a budget too tight for it, cuBLAS runs without one (it then picks
// algorithms that need none). The handle forgets the pointer when the binding ends, so no later
// call can reach a block the allocator has handed to someone else.
class WorkspaceBinding {
 public:
  WorkspaceBinding(int dev, cublasHandle_t h) : h_(h) {
    const size_t bytes = properties(dev).major >= 9 ? (size_t(32) << 20) : (size_t(4) << 20);
    try {
      MemoryCategoryGuard cat(MemoryCategory::workspace);
      ws_ = empty({int64_t(bytes)}, {.dtype = DType::u8, .device = Device(DeviceType::cuda, dev)});
    } catch (const OutOfMemoryError&) {
      ws_ = Tensor();
    }
    MG_CUBLAS_CHECK(cublasSetWorkspace(h_, ws_.defined() ? ws_.data_ptr() : nullptr, ws_.defined() ? bytes : 0));
  }
  ~WorkspaceBinding() { (void)cublasSetWorkspace(h_, nullptr, 0); }
  WorkspaceBinding(const WorkspaceBinding&) = delete;
  WorkspaceBinding& operator=(const WorkspaceBinding&) = delete;

 private:
  cublasHandle_t h_;
  Tensor ws_;  // (bytes) u8, tagged workspace
};

// The cuBLAS call for row-major operands: C^T (N x M, ld ldc) = op(B)^T op(A)^T, column-major.
void gemm_call(cublasHandle_t h, const GemmTypes& ty, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
               const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb, double beta, void* C,
               int64_t ldc, int64_t sc, int64_t batch) {
  const float alpha32 = float(alpha), beta32 = float(beta);
  const void* pal = ty.f64 ? static_cast<const void*>(&alpha) : static_cast<const void*>(&alpha32);
  const void* pbe = ty.f64 ? static_cast<const void*>(&beta) : static_cast<const void*>(&beta32);
  MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             as_int(N, "N"), as_int(M, "M"), as_int(K, "K"), pal, B, ty.data,
                                             as_int(ldb, "ldb"), sb, A, ty.data, as_int(lda, "lda"), sa, pbe, C,
                                             ty.data, as_int(ldc, "ldc"), sc, as_int(batch, "batch"), ty.compute,
                                             CUBLAS_GEMM_DEFAULT));
}

Tensor contiguous_copy(const Tensor& t) {
  MemoryCategoryGuard ws(MemoryCategory::workspace);
  Tensor c = empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
  copy(c, t);
  return c;
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const Tensor& bias) {
  const char* op = "matmul";
  MG_CHECK(out.is_contiguous() && out.dim() >= 2, op, ": internal: CUDA output must be contiguous (..., N, M)");
  Tensor a = a_in, b = b_in;
  const int64_t N = a.size(-2), K = a.size(-1), M = b.size(-1);
  if (out.numel() == 0) return;
  const int dev = out.device().index;
  DeviceGuard g(dev);
  // The bias first: every row of out = bias, then the GEMM accumulates with beta = 1.
  if (bias.defined()) {
    Shape st(size_t(out.dim()), 0);
    st.back() = bias.stride(0);
    copy(out, bias.as_strided(out.shape(), st, bias.storage_offset()));
  }
  if (K == 0) {
    if (!bias.defined()) fill(out, 0.0);
    return;
  }
  std::optional<GemmView> va = gemm_view(N, K, a.stride(-2), a.stride(-1));
  std::optional<GemmView> vb = gemm_view(K, M, b.stride(-2), b.stride(-1));
  if (!va) a = contiguous_copy(a), va = gemm_view(N, K, K, 1);
  if (!vb) b = contiguous_copy(b), vb = gemm_view(K, M, M, 1);
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  const int64_t nb = numel_of(batch);
  Shape sa = batch_strides(a, batch), sb = batch_strides(b, batch);
  const GemmTypes ty = gemm_types(out.dtype());
  const size_t es = out.element_size();
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  const double beta = bias.defined() ? 1.0 : 0.0;
  cublasHandle_t h = cublas_handle(dev);
  WorkspaceBinding workspace(dev, h);
  // Row-major out (rows, M) = a (rows, K) b (K, M); strides in elements.
  auto strided = [&](int64_t rows, int64_t stride_a, int64_t stride_b, int64_t stride_c, int64_t count, int64_t a_ld) {
    gemm_call(h, ty, va->trans, vb->trans, rows, M, K, 1.0, pa, a_ld, stride_a, pb, vb->ld, stride_b, beta, po, M,
              stride_c, count);
  };
  const bool b_shared = std::all_of(sb.begin(), sb.end(), [](int64_t s) { return s == 0; });
  if (nb > 1 && b_shared) {
    if (auto ld = flat_row_stride(batch, sa, N, K, *va)) return strided(nb * N, 0, 0, 0, 1, *ld);
  }
  std::optional<int64_t> la = linear_batch_stride(batch, sa), lb = linear_batch_stride(batch, sb);
  if (nb == 1 || (la && lb)) return strided(N, nb == 1 ? 0 : *la, nb == 1 ? 0 : *lb, N * M, nb, va->ld);
  // Irregular batch offsets (broadcast in a middle dim): pointer arrays on the device.
  std::vector<const void*> host_ptrs(size_t(3 * nb));  // 3 * nb pointers, a few KB at most
  for (int64_t i = 0; i < nb; ++i) {
    host_ptrs[size_t(i)] = pb + batch_offset(i, batch, sb) * int64_t(es);
    host_ptrs[size_t(nb + i)] = pa + batch_offset(i, batch, sa) * int64_t(es);
    host_ptrs[size_t(2 * nb + i)] = po + i * N * M * int64_t(es);
  }
  Tensor dev_ptrs;
  {
    MemoryCategoryGuard ws(MemoryCategory::workspace);
    dev_ptrs = empty({3 * nb}, {.dtype = DType::i64, .device = out.device()});  // (3, nb) pointers
  }
  copy_bytes(dev_ptrs.data_ptr(), out.device(), host_ptrs.data(), kCPU, host_ptrs.size() * sizeof(void*));
  const void* const* d = static_cast<const void* const*>(dev_ptrs.data_ptr());
  const float one32 = 1.0f, beta32 = float(beta);
  const double one64 = 1.0;
  const void* pal = ty.f64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* pbe = ty.f64 ? static_cast<const void*>(&beta) : static_cast<const void*>(&beta32);
  MG_CUBLAS_CHECK(cublasGemmBatchedEx(h, vb->trans ? CUBLAS_OP_T : CUBLAS_OP_N, va->trans ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      as_int(M, "M"), as_int(N, "N"), as_int(K, "K"), pal, d, ty.data,
                                      as_int(vb->ld, "ldb"), d + nb, ty.data, as_int(va->ld, "lda"), pbe,
                                      const_cast<void* const*>(d + 2 * nb), ty.data, as_int(M, "ldc"),
                                      as_int(nb, "batch"), ty.compute, CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched(int device, DType dtype, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                          const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b,
                          double beta, void* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  DeviceGuard g(device);
  cublasHandle_t h = cublas_handle(device);
  WorkspaceBinding workspace(device, h);
  gemm_call(h, gemm_types(dtype), ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
            batch);
}

}  // namespace mg::cuda
