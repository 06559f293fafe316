// The launchers of ops/cuda/launchers.h and ops/cuda/int8_launchers.h in a build without CUDA (CMake
// ops/cuda/, never both), so op files dispatch with a plain `if (x.device().is_cuda())` and no
// preprocessor. Every launcher throws naming the op and the tensor's device; in practice a cuda:N
// tensor cannot exist here (core/cuda_stub.cpp refuses the device first), so this is the backstop.
#include "core/error.h"
#include "ops/cuda/int8_launchers.h"
#include "ops/cuda/launchers.h"

namespace mg::cuda {
namespace {

[[noreturn]] void no_cuda(const char* op, const Tensor& t) {
  MG_THROW(op, ": tensor on ", t.defined() ? t.device().str() : std::string("cuda"),
           " but this memgrad was built without CUDA (configure with `cmake --preset cuda`)");
}

[[noreturn]] void no_cuda_device(const char* op, int device) {
  MG_THROW(op, ": data on cuda:", device,
           " but this memgrad was built without CUDA (configure with `cmake --preset cuda`)");
}

}  // namespace

void unary(UnaryOp, const Tensor& out, const Tensor&) { no_cuda("unary op", out); }
void binary(BinaryOp, const Tensor& out, const Tensor&, const Tensor&) { no_cuda("binary op", out); }
void binary_scalar(BinaryOp, const Tensor& out, const Tensor&, double) { no_cuda("binary op", out); }
void compare(CompareOp, const Tensor& out, const Tensor&, const Tensor&) { no_cuda("compare", out); }
void compare_scalar(CompareOp, const Tensor& out, const Tensor&, double) { no_cuda("compare", out); }
void where(const Tensor& out, const Tensor&, const Tensor&, const Tensor&) { no_cuda("where", out); }

void sum(const Tensor& out, const Tensor&, const std::vector<bool>&) { no_cuda("sum", out); }
void amax(const Tensor&, const Tensor&, const Tensor& x, int64_t) { no_cuda("amax", x); }
void mse_loss(const Tensor& loss, const Tensor&, const Tensor&) { no_cuda("mse_loss", loss); }

void softmax_forward(const Tensor& y, const Tensor&, int64_t, int64_t, int64_t, bool) { no_cuda("softmax", y); }
void softmax_backward(const Tensor& dx, const Tensor&, const Tensor&, int64_t, int64_t, int64_t, bool) {
  no_cuda("softmax backward", dx);
}

int64_t cross_entropy_count(const Tensor& target, int64_t, int64_t) { no_cuda("cross_entropy", target); }
void cross_entropy_forward(const Tensor& loss, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t) {
  no_cuda("cross_entropy", loss);
}
void cross_entropy_backward(const Tensor& dx, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                            int64_t) {
  no_cuda("cross_entropy backward", dx);
}

void layer_norm_forward(const Tensor& y, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        double) {
  no_cuda("layer_norm", y);
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor& dy, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&) {
  no_cuda("layer_norm backward", dy);
}

void batch_norm_stats(const Tensor&, const Tensor& x, int64_t, int64_t, int64_t) { no_cuda("batch_norm", x); }
void batch_norm_finish_stats(const Tensor&, const Tensor&, const Tensor& stats, double, const Tensor&, const Tensor&,
                             double, double) {
  no_cuda("batch_norm", stats);
}
void batch_norm_normalize(const Tensor& y, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          int64_t, int64_t, int64_t) {
  no_cuda("batch_norm", y);
}
void batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor& dy, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, int64_t, int64_t, int64_t, bool) {
  no_cuda("batch_norm backward", dy);
}

void matmul(const Tensor& out, const Tensor&, const Tensor&, const Tensor&) { no_cuda("matmul", out); }

void attention_forward(const AttentionDims&, const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&) {
  no_cuda("attention", q);
}
void attention_backward(const AttentionDims&, const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("attention backward", q);
}

void flash_attention_forward(const FlashAttentionDims&, const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) {
  no_cuda("flash attention", q);
}
void flash_attention_backward(const FlashAttentionDims&, const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&) {
  no_cuda("flash attention backward", q);
}

void max_pool2d_forward(const Pool2dGeom&, const Tensor& x, const Tensor&, const Tensor&) { no_cuda("max_pool2d", x); }
void max_pool2d_backward(const Pool2dGeom&, const Tensor& dout, const Tensor&, const Tensor&) {
  no_cuda("max_pool2d backward", dout);
}
void avg_pool2d_forward(const Pool2dGeom&, const Tensor& x, const Tensor&) { no_cuda("avg_pool2d", x); }
void avg_pool2d_backward(const Pool2dGeom&, const Tensor& dout, const Tensor&) { no_cuda("avg_pool2d backward", dout); }
void global_avg_pool2d_forward(const Tensor& x, const Tensor&) { no_cuda("global_avg_pool2d", x); }
void global_avg_pool2d_backward(const Tensor& dout, const Tensor&) { no_cuda("global_avg_pool2d backward", dout); }

void conv2d_forward(const Conv2dGeom&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("conv2d", x);
}
void conv2d_backward(const Conv2dGeom&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                     const Tensor&) {
  no_cuda("conv2d backward", x);
}
bool have_cudnn() { return false; }

void check_indices(const Tensor& idx, int64_t, const Tensor&) { no_cuda("embedding", idx); }
void embedding_forward(const Tensor& out, const Tensor&, const Tensor&) { no_cuda("embedding", out); }
void embedding_backward(const Tensor& dweight, const Tensor&, const Tensor&) { no_cuda("embedding backward", dweight); }

void dropout(const Tensor& out, const Tensor&, uint64_t, uint64_t, double) { no_cuda("dropout", out); }

void adam_step(const Tensor& w, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamStep&) {
  no_cuda("adam step", w);
}
void sgd_step(const Tensor& w, const Tensor&, const Tensor&, const Tensor&, const SgdStep&) { no_cuda("sgd step", w); }

void int8_row_sums(int device, const int8_t*, int64_t, int64_t, int32_t*) { no_cuda_device("int8_pack_a", device); }
void int8_gemm(int device, int64_t, int64_t, int64_t, const int8_t*, const int32_t*, const uint8_t*, const float*,
               const Int8Layout&, float, int32_t, const Int8GemmOut&) {
  no_cuda_device("int8_gemm", device);
}
void int8_depthwise(int device, const Int8DepthwiseShape&, const uint8_t*, int32_t, const int8_t*,
                    const Int8DepthwiseOut&) {
  no_cuda_device("int8_depthwise", device);
}
void quantize_per_tensor(const Tensor& out, const Tensor&, float, int32_t) { no_cuda("quantize_per_tensor", out); }
void dequantize_per_tensor(const Tensor& out, const Tensor&, float, int32_t) { no_cuda("dequantize_per_tensor", out); }
void dequantize_per_channel(const Tensor& out, const Tensor&, const Tensor&) { no_cuda("dequantize_per_channel", out); }
void fake_quantize_per_channel(const Tensor& out, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("fake_quantize_per_channel", out);
}
void fake_quantize_per_tensor(const Tensor& out, const Tensor&, const Tensor&, float, float, int32_t) {
  no_cuda("fake_quantize_per_tensor", out);
}
void fake_quantize_learned_backward(const Tensor&, const Tensor&, const Tensor& x, const Tensor&, const Tensor&,
                                    fq::Grid, fq::ScaleDivision, double) {
  no_cuda("fake_quantize_learned backward", x);
}

}  // namespace mg::cuda
