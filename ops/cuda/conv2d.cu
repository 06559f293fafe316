// CUDA conv2d on cuDNN (any groups: MobileNetV2's depthwise convs too). For each call the
// algorithm is chosen from cuDNN's heuristic ranking (v7 API) as the first one whose workspace
// fits what the device's memory budget leaves; the workspace is an mg::empty tensor tagged
// workspace, so it shows in the allocator's statistics like every other byte. Backward uses
// deterministic algorithms only (the same bits on every run, as on the CPU). f16/bf16 run on
// tensor cores with f32 accumulation; f32 allows TF32 only when allow_tf32().
#include "core/allocator.h"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/launchers.h"

namespace mg::cuda {

#ifndef MG_WITH_CUDNN

bool have_cudnn() { return false; }

void conv2d_forward(const Conv2dGeom&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  MG_THROW("conv2d: this memgrad was built without cuDNN, so conv2d cannot run on CUDA"
           "\n  hint: install cuDNN 9 and reconfigure (CUDNN_ROOT=...), or run the model on cpu");
}
void conv2d_backward(const Conv2dGeom& g, const Tensor& x, const Tensor& w, const Tensor&, const Tensor&,
                     const Tensor&, const Tensor&) {
  conv2d_forward(g, x, w, Tensor(), Tensor());
}

#else

bool have_cudnn() { return true; }

namespace {

constexpr size_t kMaxWorkspaceWithoutBudget = size_t(1) << 30;

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: MG_THROW("conv2d: dtype ", t, " is not supported on CUDA");
  }
}

// The descriptors of one convolution, destroyed with it (also when a call throws).
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  ConvDescriptors(const Conv2dGeom& g, DType dt) {
    const cudnnDataType_t t = cudnn_type(dt);
    auto i32 = [](int64_t v) {
      MG_CHECK(v >= 0 && v < (int64_t(1) << 31), "conv2d: size ", v, " is too large for cuDNN");
      return int(v);
    };
    MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    MG_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    MG_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    MG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, t, i32(g.N), i32(g.Cin), i32(g.H), i32(g.W)));
    MG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, t, i32(g.N), i32(g.Cout), i32(g.OH), i32(g.OW)));
    MG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, t, CUDNN_TENSOR_NCHW, i32(g.Cout), i32(g.Cin / g.groups), i32(g.KH),
                                              i32(g.KW)));
    const cudnnDataType_t acc = dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    MG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, i32(g.pad), i32(g.pad), i32(g.stride), i32(g.stride), 1, 1,
                                                   CUDNN_CROSS_CORRELATION, acc));
    MG_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, i32(g.groups)));
    const cudnnMathType_t math = (dt == DType::f16 || dt == DType::bf16) ? CUDNN_TENSOR_OP_MATH
                                 : (dt == DType::f32 && allow_tf32())   ? CUDNN_DEFAULT_MATH
                                                                        : CUDNN_FMA_MATH;
    MG_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
  }
  ~ConvDescriptors() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;
};

// Bytes a workspace may take now: what the budget leaves (cached blocks can be reused), or 1 GiB.
size_t workspace_allowance(Device d) {
  MemoryStats st = memory_stats(d);
  if (st.limit == 0) return kMaxWorkspaceWithoutBudget;
  const int64_t left = int64_t(st.limit) - st.allocated.current;
  return left > 0 ? std::min(size_t(left), kMaxWorkspaceWithoutBudget) : 0;
}

// Tries the ranked algorithms in order: the first that cuDNN supports, that is deterministic when
// asked, and whose workspace fits the allowance and can be allocated, runs via run(algo, ws, bytes).
template <class Perf, class Run>
void run_ranked(const char* what, const Perf* perf, int count, bool need_deterministic, Device d, Run run) {
  const size_t allowance = workspace_allowance(d);
  std::string tried;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (need_deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (p.memory > allowance) {
      tried += ::mg::detail::str_cat(" ", int(p.algo), " (", format_bytes(int64_t(p.memory)), ")");
      continue;
    }
    Tensor ws;
    if (p.memory > 0) {
      try {
        MemoryCategoryGuard cat(MemoryCategory::workspace);
        ws = empty({int64_t(p.memory)}, {.dtype = DType::u8, .device = d});
      } catch (const OutOfMemoryError&) {
        tried += ::mg::detail::str_cat(" ", int(p.algo), " (", format_bytes(int64_t(p.memory)), ", out of memory)");
        continue;
      }
    }
    run(p.algo, ws.defined() ? ws.data_ptr() : nullptr, size_t(p.memory));
    return;
  }
  MG_THROW("conv2d: no cuDNN algorithm for ", what, " fits the memory left on ", d.str(), " (",
           format_bytes(int64_t(allowance)), " allowed; tried algorithms:", tried.empty() ? " none usable" : tried, ")",
           "\n  hint: raise the memory limit or use a smaller batch");
}

struct Scalars {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  bool f64;
  const void* one() const { return f64 ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1); }
  const void* zero() const { return f64 ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0); }
};

template <class T>
__global__ void add_channel_bias_kernel(T* out, const T* bias, int64_t C, int64_t hw, int64_t n) {
  using A = compute_t<T>;
  MG_GRID_STRIDE(e, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, n) out[e] = T(A(out[e]) + A(bias[(e / hw) % C]));
}

}  // namespace

void conv2d_forward(const Conv2dGeom& g, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  if (out.numel() == 0) return;
  MG_CHECK(x.is_contiguous() && w.is_contiguous() && out.is_contiguous() && (!bias.defined() || bias.is_contiguous()),
           "conv2d: internal: CUDA operands must be contiguous");
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudnnHandle_t h = cudnn_handle(dev);
  ConvDescriptors desc(g, x.dtype());
  const Scalars s{.f64 = x.dtype() == DType::f64};
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int count = 0;
  MG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, desc.x, desc.w, desc.conv, desc.y,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
  run_ranked("the forward pass", perf, count, false, x.device(), [&](cudnnConvolutionFwdAlgo_t algo, void* ws, size_t bytes) {
    MG_CUDNN_CHECK(cudnnConvolutionForward(h, s.one(), desc.x, x.data_ptr(), desc.w, w.data_ptr(), desc.conv, algo, ws,
                                           bytes, s.zero(), desc.y, out.data_ptr()));
  });
  if (bias.defined()) {
    const int64_t n = out.numel();
    MG_DISPATCH_FLOAT(out.dtype(), "conv2d", [&] {
      add_channel_bias_kernel<scalar_t><<<grid_for(dev, n, kThreads), kThreads, 0, stream(dev)>>>(
          elem_ptr<scalar_t>(out), elem_ptr<const scalar_t>(bias), g.Cout, g.OH * g.OW, n);
      MG_CUDA_CHECK_LAUNCH("add_channel_bias_kernel");
    });
  }
}

void conv2d_backward(const Conv2dGeom& g, const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                     const Tensor& dw, const Tensor& db) {
  MG_CHECK(dout.is_contiguous(), "conv2d_backward: internal: CUDA dout must be contiguous");
  const int dev = dout.device().index;
  DeviceGuard guard(dev);
  if (db.defined()) sum(db, dout, {true, false, true, true});  // (Cout): over n, oh, ow
  if (!dx.defined() && !dw.defined()) return;
  if (dout.numel() == 0) {
    if (dx.defined()) fill(dx, 0.0);
    if (dw.defined()) fill(dw, 0.0);
    return;
  }
  cudnnHandle_t h = cudnn_handle(dev);
  ConvDescriptors desc(g, dout.dtype());
  const Scalars s{.f64 = dout.dtype() == DType::f64};
  if (dx.defined()) {
    MG_CHECK(w.defined() && w.is_contiguous() && dx.is_contiguous(), "conv2d_backward: internal: bad CUDA operands");
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    MG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, desc.w, desc.y, desc.conv, desc.x,
                                                               CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
    run_ranked("the input gradient", perf, count, true, dout.device(),
               [&](cudnnConvolutionBwdDataAlgo_t algo, void* ws, size_t bytes) {
                 MG_CUDNN_CHECK(cudnnConvolutionBackwardData(h, s.one(), desc.w, w.data_ptr(), desc.y, dout.data_ptr(),
                                                             desc.conv, algo, ws, bytes, s.zero(), desc.x,
                                                             dx.data_ptr()));
               });
  }
  if (dw.defined()) {
    MG_CHECK(x.defined() && x.is_contiguous() && dw.is_contiguous(), "conv2d_backward: internal: bad CUDA operands");
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    MG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, desc.x, desc.y, desc.conv, desc.w,
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    run_ranked("the weight gradient", perf, count, true, dout.device(),
               [&](cudnnConvolutionBwdFilterAlgo_t algo, void* ws, size_t bytes) {
                 MG_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, s.one(), desc.x, x.data_ptr(), desc.y,
                                                               dout.data_ptr(), desc.conv, algo, ws, bytes, s.zero(),
                                                               desc.w, dw.data_ptr()));
               });
  }
}

#endif  // MG_WITH_CUDNN

}  // namespace mg::cuda
