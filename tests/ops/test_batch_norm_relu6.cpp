// batch_norm_relu6 against relu6(batch_norm(x)): the same bits for the output, every gradient and
// the running statistics (f32, f64, and 16-bit inputs with f32 parameters; training and eval;
// outputs exactly at the clamp's edges), f64 gradcheck, and what it saves: x, the statistics,
// weight and bias, and no (N, C, H, W) tensor for the ReLU6.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/saved_tensor.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;
using test::leaf;
using test::rand_tensor;

namespace {

struct BnCase {
  Tensor x, w, b, rm, rv;  // rm / rv undefined: batch statistics only
  bool training;
};

// Output, the gradients of x, w and b, and the running statistics after one step.
std::vector<std::vector<double>> run(const BnCase& c, const Tensor& dout, bool fused) {
  Tensor x = leaf(clone(c.x));
  Tensor w = c.w.defined() ? leaf(clone(c.w)) : Tensor(), b = c.b.defined() ? leaf(clone(c.b)) : Tensor();
  Tensor rm = c.rm.defined() ? clone(c.rm) : Tensor(), rv = c.rv.defined() ? clone(c.rv) : Tensor();
  Tensor y = fused ? batch_norm_relu6(x, rm, rv, w, b, c.training) : relu6(batch_norm(x, rm, rv, w, b, c.training));
  backward(y, dout);
  std::vector<std::vector<double>> r{y.to_double_vector(), x.grad().to_double_vector()};
  for (const Tensor& t : {w, b, rm, rv})
    if (t.defined()) r.push_back(t.requires_grad() ? t.grad().to_double_vector() : t.to_double_vector());
  return r;
}

}  // namespace

TEST_CASE("batch_norm_relu6 equals relu6(batch_norm(x)) bit for bit: values, gradients, running stats",
          "[norm][relu6]") {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    const DType pt = dt == DType::f64 ? DType::f64 : DType::f32;  // f32 parameters for 16-bit inputs
    for (bool training : {true, false}) {
      // 3 x 5 planes of 20 x 30 = 600 values (more than one block), spread so that many outputs
      // are clamped at 0 and at 6; a (N, C) input too.
      for (const Shape& s : {Shape{3, 5, 20, 30}, Shape{40, 6}}) {
        INFO(dt << (training ? " training " : " eval ") << shape_str(s));
        const int64_t C = s[1];
        BnCase c{cast(rand_tensor(s, 1, DType::f32, -3, 9), dt), rand_tensor({C}, 2, pt, 0.5, 4),
                 rand_tensor({C}, 3, pt, -1, 5), rand_tensor({C}, 4, pt), rand_tensor({C}, 5, pt, 0.5, 2), training};
        Tensor dout = cast(rand_tensor(s, 6, DType::f32), dt);
        CHECK(run(c, dout, true) == run(c, dout, false));
        c.w = Tensor();  // no weight, and no statistics
        c.rm = c.rv = Tensor();
        if (training) CHECK(run(c, dout, true) == run(c, dout, false));
      }
    }
  }
  // Outputs exactly 0 and 6 (eval, identity statistics): the clamp's edges pass no gradient.
  Tensor x = from_vector({-1.0, 0.0, 3.0, 6.0, 7.0, 0.5}, {3, 2});
  BnCase edge{x, ones({2}), zeros({2}), zeros({2}), full({2}, 1.0 - 1e-5), false};
  Tensor dout = ones({3, 2});
  std::vector<std::vector<double>> fused = run(edge, dout, true);
  CHECK(fused == run(edge, dout, false));
  CHECK(fused[1] == std::vector<double>{0, 0, 1, 0, 0, 1});
}

TEST_CASE("batch_norm_relu6 passes gradcheck for x, weight and bias in training and eval", "[norm][relu6]") {
  // Outputs kept away from 0 and 6, where the clamp has no derivative.
  Tensor x = leaf(rand_tensor({4, 3, 2, 5}, 7, DType::f64, -2, 2));
  Tensor w = leaf(rand_tensor({3}, 8, DType::f64, 0.5, 1)), b = leaf(rand_tensor({3}, 9, DType::f64, 2.5, 3.5));
  Tensor rm = rand_tensor({3}, 10, DType::f64, -0.5, 0.5), rv = rand_tensor({3}, 11, DType::f64, 1, 2);
  test::check_gradcheck([](const std::vector<Tensor>& v) { return batch_norm_relu6(v[0], {}, {}, v[1], v[2], true); },
                        {x, w, b});
  test::check_gradcheck([&](const std::vector<Tensor>& v) { return batch_norm_relu6(v[0], rm, rv, v[1], v[2], false); },
                        {x, w, b});
  // Only the bias needs a gradient: it is still masked by the clamp.
  Tensor xc = rand_tensor({4, 3, 2, 5}, 12, DType::f64, -3, 3);
  test::check_gradcheck([&](const std::vector<Tensor>& v) { return batch_norm_relu6(xc, {}, {}, {}, v[0], true); },
                        {leaf(rand_tensor({3}, 13, DType::f64, 1, 2))});
}

TEST_CASE("batch_norm_relu6 keeps no tensor for the ReLU6: one (N, C, H, W) tensor less than the pair",
          "[norm][relu6]") {
  const Device dev("cpu:12");
  const Shape s{8, 16, 12, 12};
  Tensor x = leaf(empty(s, {.device = dev}));
  copy_(x, rand_tensor(s, 14, DType::f32, -3, 9));
  Tensor w = leaf(ones({16}, {.device = dev})), b = leaf(zeros({16}, {.device = dev}));
  auto act = [&] { return memory_stats(dev).category(MemoryCategory::activation).current; };
  auto kept = [&](bool fused, std::vector<Shape>* saved) {
    const int64_t before = act();
    SavedTensorHooksGuard hooks({.pack = [&](const Tensor& t) -> std::any {
                                   if (saved) saved->push_back(t.shape());
                                   return t;
                                 },
                                 .unpack = [](const std::any& a) { return std::any_cast<Tensor>(a); }});
    Tensor y = fused ? batch_norm_relu6(x, {}, {}, w, b, true) : relu6(batch_norm(x, {}, {}, w, b, true));
    return act() - before;  // y and what backward keeps (the statistics)
  };
  std::vector<Shape> saved;
  const int64_t fused = kept(true, &saved);
  CHECK(saved == std::vector<Shape>{s, Shape{16}, Shape{16}, Shape{16}, Shape{16}});  // x, mean, rstd, w, b
  CHECK(kept(false, nullptr) - fused == numel_of(s) * 4);  // the batch norm output the ReLU6 saved
}

TEST_CASE("batch_norm_relu6 on meta gives the shapes and bytes of the cpu run", "[norm][relu6]") {
  for (Device dev : {Device("meta"), Device("cpu:13")}) {
    reset_peak_stats(dev);
    Tensor x = leaf(empty({4, 8, 5, 5}, {.device = dev}));
    if (!dev.is_meta()) copy_(x, rand_tensor({4, 8, 5, 5}, 15, DType::f32));
    Tensor w = leaf(ones({8}, {.device = dev})), b = leaf(zeros({8}, {.device = dev}));
    Tensor y = batch_norm_relu6(x, {}, {}, w, b, true);
    CHECK(y.shape() == Shape{4, 8, 5, 5});
    backward(sum(y));
    CHECK(x.grad().shape() == Shape{4, 8, 5, 5});
  }
  CHECK(memory_stats(Device("meta")).allocated.peak == memory_stats(Device("cpu:13")).allocated.peak);
}
