// Quantized layers for inference (built by models/compress/quant_convert.h, loaded by
// quant_format.h). Weights are int8 symmetric per output channel (buffers weight_int8 i8 and
// weight_scale f32; from_float takes the scales QAT learned, or max|w_c| / 127 when given none),
// biases f32. Two kinds:
// - weight-only (Int8WeightOnlyLinear, Int8WeightOnlyConv2d): int8 storage, dequantized into a
//   workspace tensor per forward and multiplied in f32 (GPT's Linears, 3x3 and depthwise convs);
// - full int8 (Int8Linear, Int8Conv2d 1x1, Int8DepthwiseConv2d): activations quantized to u8 with
//   calibrated input_scale / input_zero_point, int8 x int8 -> int32 (ops/int8_gemm.h,
//   ops/int8_depthwise.h), requantized to f32, or to u8 when the next layer is int8 too
//   (link_output): MobileNetV2's expand 1x1 -> depthwise 3x3 -> project 1x1 pass u8 activations in
//   the next layer's input quantization, with no f32 tensor and no quantize pass between them.
// Shapes: N batch, C channels, H W spatial.
#pragma once
#include <memory>
#include <string>

#include "models/nn/layers.h"
#include "ops/int8_depthwise.h"
#include "ops/int8_gemm.h"
#include "ops/quantize.h"

namespace mg {

// What a transformation left in place of a layer it absorbed (a BatchNorm folded into its conv,
// a ReLU6 fused into the int8 conv's clamp): passes x through. type_name says which.
class Absorbed : public UnaryModule {
 public:
  explicit Absorbed(std::string what) : UnaryModule(std::move(what)) {}
  Tensor forward(const Tensor& x) override { return x; }
};

// x: (..., in) -> (..., out). y = x dequant(W)^T + b in f32.
class Int8WeightOnlyLinear : public Linear {
 public:
  // Zero weights (scale 1), to be filled by load_state_dict.
  Int8WeightOnlyLinear(int64_t in, int64_t out, bool bias, Device device);
  static std::shared_ptr<Int8WeightOnlyLinear> from_float(const Linear& src);
  Tensor forward(const Tensor& x) override;
  Tensor weight_int8, weight_scale;  // (out, in) i8, (out) f32
};

// The activation quantization every full-int8 layer keeps as buffers (input_scale (1) f32,
// input_zero_point (1) i32), checked when read.
struct Int8Input {
  Tensor scale, zero_point;
  void init(Module& owner, ActivationQParams q, Device device);
  ActivationQParams get(const char* who) const;
};

// x: (..., in) -> (..., out), int8 GEMM.
class Int8Linear : public Linear {
 public:
  Int8Linear(int64_t in, int64_t out, bool bias, Device device);
  static std::shared_ptr<Int8Linear> from_float(const Linear& src, ActivationQParams input,
                                                const Tensor& weight_scales = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight_int8, weight_scale;
  Int8Input input;

 private:
  Int8PackedA packed_;
  uint64_t packed_version_ = ~uint64_t(0);
};

// A full-int8 conv's input and output: it takes f32 (quantized on the way in) or u8 already in its
// own input quantization (what the int8 layer before it wrote), and writes f32 or, once linked to
// the next int8 layer, u8 in that layer's input quantization.
class Int8ConvBase : public UnaryModule {
 public:
  using UnaryModule::UnaryModule;
  // From now on write u8 in `next`'s input quantization (read at each forward, so a later
  // load_state_dict of next's buffers is seen). `next` must outlive this layer (both in one model).
  void link_output(const Int8Input* next) { next_input_ = next; }
  bool output_linked() const { return next_input_ != nullptr; }
  int64_t in_channels, out_channels;
  bool fused_relu6 = false;
  Tensor weight_int8, weight_scale, bias;  // (Cout, Cin/groups, K, K) i8, (Cout) f32, (Cout) f32 or undefined
  Int8Input input;

 protected:
  Int8ConvBase(const char* type, int64_t in, int64_t out, Shape weight_shape, bool with_bias, Device device);
  // x: (N, in_channels, H, W) f32 or u8, else an error naming `type_name()`.
  void check_input(const Tensor& x) const;
  // The output tensor (f32, or u8 when linked) and the epilogue's clamp and output quantization.
  Tensor empty_output(const Shape& shape, Device device) const;
  Requant requant() const;
  // Copies the quantized weights (with weight_scales, or max|w_c| / 127 when undefined) and bias of
  // `src` and the input quantization.
  void set_from(const Conv2d& src, ActivationQParams in_q, const Tensor& weight_scales);

 private:
  const Int8Input* next_input_ = nullptr;
};

// x: (N, Cin, H, W) -> (N, Cout, H, W): a 1x1, stride 1, ungrouped convolution on the int8 GEMM,
// with an optional fused ReLU6 (the clamp in the requantization).
class Int8Conv2d : public Int8ConvBase {
 public:
  Int8Conv2d(int64_t in_channels, int64_t out_channels, bool bias, Device device);
  // src must be 1x1, stride 1, padding 0, groups 1.
  static std::shared_ptr<Int8Conv2d> from_float(const Conv2d& src, ActivationQParams input,
                                                const Tensor& weight_scales = {});
  static bool supports(const Conv2d& c);
  Tensor forward(const Tensor& x) override;

 private:
  Int8PackedA packed_;
  uint64_t packed_version_ = ~uint64_t(0);
};

// x: (N, C, H, W) -> (N, C, OH, OW): a depthwise (groups = channels) K x K convolution on the int8
// depthwise kernel, any stride and padding, with an optional fused ReLU6.
class Int8DepthwiseConv2d : public Int8ConvBase {
 public:
  Int8DepthwiseConv2d(int64_t channels, int64_t kernel_size, Conv2dParams params, bool bias, Device device);
  static std::shared_ptr<Int8DepthwiseConv2d> from_float(const Conv2d& src, ActivationQParams input,
                                                         const Tensor& weight_scales = {});
  static bool supports(const Conv2d& c);  // groups == in == out channels
  Tensor forward(const Tensor& x) override;
  int64_t kernel_size;
  Conv2dParams params;
};

// Any Conv2d with int8 weights, computed in f32 (the stem's 3x3 conv, depthwise 3x3 convs).
class Int8WeightOnlyConv2d : public UnaryModule {
 public:
  Int8WeightOnlyConv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dParams params, bool bias,
                       Device device);
  static std::shared_ptr<Int8WeightOnlyConv2d> from_float(const Conv2d& src, const Tensor& weight_scales = {});
  Tensor forward(const Tensor& x) override;
  int64_t in_channels, out_channels, kernel_size;
  Conv2dParams params;
  Tensor weight_int8, weight_scale, bias;
};

}  // namespace mg
