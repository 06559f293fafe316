// conv2d: forward values against PyTorch (general, grouped, pointwise and depthwise paths),
// f64 gradcheck over stride x padding x groups x bias (and strided / transposed inputs), meta
// shapes and workspace bytes, error messages, f16/bf16 against f32, and bit-identical results
// with 1 and 2 threads.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "ops/ops.h"

using namespace mg;

namespace {

// Tensor of `shape` with element i = f(i) (flat row-major index).
Tensor seq(const Shape& shape, const std::function<double(int64_t)>& f, DType dt = DType::f32, Device dev = kCPU) {
  std::vector<double> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = f(int64_t(i));
  return from_vector(v, shape, {.dtype = dt, .device = dev});
}
double fx(int64_t i) { return std::sin(0.37 * double(i) + 0.1); }
double fw(int64_t i) { return 0.5 * std::cos(0.23 * double(i)); }
double fb(int64_t i) { return 0.1 * double(i + 1) - 0.15; }

void check_close(const Tensor& t, const std::vector<double>& ref, double rtol, double atol) {
  std::vector<double> v = t.to_vector<double>();
  REQUIRE(v.size() == ref.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i << ": " << v[i] << " vs " << ref[i]);
    CHECK(std::abs(v[i] - ref[i]) <= atol + rtol * std::abs(ref[i]));
  }
}

}  // namespace

// Reference values: PyTorch 1.13 in f64, OMP_NUM_THREADS=2, with the same formulas:
//   seq = lambda shape, f: torch.tensor([f(i) for i in range(prod(shape))]).reshape(shape)
//   x = seq(xs, lambda i: sin(0.37*i + 0.1)); w = seq(ws, lambda i: 0.5*cos(0.23*i))
//   b = seq((Cout,), lambda i: 0.1*(i+1) - 0.15)
//   torch.nn.functional.conv2d(x, w, b, stride=s, padding=p, groups=g).flatten()
TEST_CASE("conv2d forward matches PyTorch on every path", "[conv]") {
  struct Case {
    const char* name;
    Shape xs, ws;
    bool bias;
    Conv2dParams p;
    Shape out_shape;
    std::vector<double> ref;
  };
  std::vector<Case> cases = {
      {"general 3x2 kernel, stride 1, padding 1", {2, 3, 4, 5}, {2, 3, 3, 2}, true, {1, 1, 1}, {2, 2, 4, 6},
       {-0.110848579, 0.493719834, 1.27750934, 1.88162668, 2.22430742, 1.1428134, 0.73928271, 1.77618439,
        1.86412577, 1.6929992, 1.28596587, 0.375031835, 0.27308399, 0.00901181356, -0.68807917, -1.29880913,
        -1.74051864, -0.986064069, -1.02229501, -2.33884398, -2.51660692, -2.36052619, -1.89172657, -0.715924619,
        0.990206122, 1.58567276, 1.00959178, 0.303634561, -0.436650908, -0.493771078, 0.0592493892, -0.526658038,
        -1.21046871, -1.72368086, -1.99683363, -0.983262275, -0.959694789, -1.71257584, -1.19363825, -0.506380059,
        0.256181567, 0.443562801, -0.0231472831, 0.556042821, 1.25806817, 1.79658716, 2.09871378, 1.11711019,
        -0.227642776, -1.05239631, -1.74654845, -2.21108071, -2.38312085, -1.20051882, -0.93873336, -1.95778068,
        -1.89868364, -1.58937595, -1.07172095, -0.289161751, -0.176619052, 0.289666055, 0.949140707, 1.47338635,
        1.7914488, 0.901756478, 1.05768968, 2.37983839, 2.36922269, 2.03117655, 1.41145292, 0.383063643,
        -0.79251803, -1.18158488, -0.521203798, 0.216487041, 0.93164464, 0.757491804, 0.258181792, 1.02857276,
        1.62624184, 2.01057399, 2.12955165, 1.03734097, 0.97973077, 1.54512517, 0.92082042, 0.178654212,
        -0.58092474, -0.534479731, -0.0911735727, -0.867195692, -1.48745677, -1.89963028, -2.04793048, -0.971757506}},
      {"grouped, stride 2, no bias", {1, 4, 5, 5}, {4, 2, 3, 3}, false, {2, 0, 2}, {1, 4, 2, 2},
       {1.97307932, 1.41820309, -1.64283831, -0.475325926, -2.13318132, -3.06923204, 2.98305013, 2.70779843,
        -0.5243911, 1.24775217, -0.839998925, -2.19430016, 1.81344503, 1.46422004, -1.63624185, -0.666491104}},
      {"depthwise, multiplier 2, stride 2, padding 1", {1, 3, 5, 5}, {6, 1, 3, 3}, true, {2, 1, 3}, {1, 6, 3, 3},
       {-0.0428384809, 0.591337114, 0.626994212, 0.416231155, -0.351672065, -0.752408495, 0.0337229911, 0.89224208,
        0.955097007, -0.887103899, -1.56005075, -0.795139687, 0.517651167, 0.982304536, 0.456767157, -0.608398402,
        -1.3956654, -0.859716632, -0.738946382, -0.883736088, -0.111248758, 1.16005865, 1.00783154, 0.0400846832,
        -0.411775357, -0.41222451, 0.187132622, 0.270886427, -0.371749579, -0.458564555, -0.318669025, 0.365723919,
        0.84388175, 0.283342796, -0.567419408, -0.739001011, -0.390059288, -1.24190738, -0.680510217, 0.743109254,
        1.31589405, 0.890023773, -0.0176444029, -0.877791869, -0.582014095, 1.28461069, 1.49776297, 0.759702256,
        -0.638947777, -0.613358986, 0.39622049, 1.00266653, 1.03817357, 0.432589964}},
      {"pointwise 1x1", {2, 4, 3, 3}, {3, 4, 1, 1}, true, {1, 0, 1}, {2, 3, 3, 3},
       {-0.170948429, -0.117406231, -0.0547409149, 0.00856606141, 0.063946396, 0.10390462, 0.123032577,
        0.118741385, 0.0916118388, 0.077762171, 0.150105497, 0.208900013, 0.246188158, 0.256923156, 0.239652075,
        0.196712476, 0.133916032, 0.0597619463, 0.304586195, 0.338698086, 0.347270576, 0.329143419, 0.286770041,
        0.22588548, 0.154730174, 0.0829346622, 0.0202161288, -0.0523665828, 0.0107972314, 0.0657324255,
        0.105003779, 0.123296098, 0.118133603, 0.0902150136, 0.0433189799, -0.0162073398, 0.210695889, 0.247074911,
        0.256780767, 0.238499817, 0.194706301, 0.131327466, 0.0569413401, -0.0183842638, -0.0844543785, 0.3470722,
        0.327986675, 0.284811488, 0.223390199, 0.15203589, 0.0804060338, 0.0181953939, -0.0261761108,
        -0.0467030054}},
      {"depthwise 3x3, stride 1, padding 1", {1, 2, 4, 4}, {2, 1, 3, 3}, false, {1, 1, 2}, {1, 2, 4, 4},
       {-0.020391121, 0.307008755, 0.606998716, 0.631437493, 0.780364902, 1.51523601, 1.77621816, 1.20113308,
        1.01930682, 1.13852092, 0.548759629, 0.0148313214, -0.586441321, -1.22098318, -1.57819263, -1.22728006,
        -0.686667093, -1.36987752, -1.78534551, -1.33693475, -1.13054833, -1.68482528, -1.45843733, -0.74537162,
        -0.247950737, 0.156702353, 0.763035971, 0.802815507, 0.742785225, 1.36588131, 1.69184714, 1.14457986}},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      for (DType dt : {DType::f32, DType::f64}) {
        Tensor x = seq(c.xs, fx, dt), w = seq(c.ws, fw, dt);
        Tensor b = c.bias ? seq({c.ws[0]}, fb, dt) : Tensor();
        Tensor y = conv2d(x, w, b, c.p);
        CHECK(y.shape() == c.out_shape);
        CHECK(y.dtype() == dt);
        if (dt == DType::f32) check_close(y, c.ref, 1e-5, 1e-6);
        else check_close(y, c.ref, 1e-8, 1e-9);  // the reference has 9 significant digits
      }
    }
  }
}

TEST_CASE("conv2d gradcheck over stride, padding, groups and bias", "[conv]") {
  enum class Kind { dense, grouped, depthwise };
  for (int64_t stride : {1, 2})
    for (int64_t pad : {0, 1})
      for (Kind kind : {Kind::dense, Kind::grouped, Kind::depthwise})
        for (bool with_bias : {false, true}) {
          const int64_t groups = kind == Kind::dense ? 1 : kind == Kind::grouped ? 2 : 4;
          const int64_t cout = kind == Kind::depthwise ? 8 : 4;  // depthwise with multiplier 2
          Tensor x = seq({2, 4, 5, 4}, fx, DType::f64).set_requires_grad(true);
          Tensor w = seq({cout, 4 / groups, 3, 3}, fw, DType::f64).set_requires_grad(true);
          Tensor b = seq({cout}, fb, DType::f64).set_requires_grad(true);
          std::vector<Tensor> inputs = {x, w};
          if (with_bias) inputs.push_back(b);
          Conv2dParams p{stride, pad, groups};
          auto r = gradcheck([&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), p); },
                             inputs);
          INFO("stride " << stride << " padding " << pad << " groups " << groups << " bias " << with_bias << ": " << r.message);
          CHECK(r.ok);
        }
}

TEST_CASE("conv2d gradcheck with strided inputs, non-square kernels and pointwise", "[conv]") {
  // x stored as (N, C, W, H) and viewed transposed, weight likewise: the op must read strides.
  Tensor xt = seq({2, 4, 4, 5}, fx, DType::f64).set_requires_grad(true);
  Tensor wt = seq({3, 4, 2, 3}, fw, DType::f64).set_requires_grad(true);
  auto r = gradcheck([](const std::vector<Tensor>& in) {
    return conv2d(transpose(in[0], 2, 3), transpose(in[1], 2, 3), Tensor(), {2, 1, 1});
  }, {xt, wt});
  INFO(r.message);
  CHECK(r.ok);
  // Pointwise (1x1, stride 1: no im2col) and a depthwise conv on a channel slice.
  Tensor x = seq({2, 6, 3, 4}, fx, DType::f64).set_requires_grad(true);
  Tensor w1 = seq({5, 6, 1, 1}, fw, DType::f64).set_requires_grad(true);
  Tensor b1 = seq({5}, fb, DType::f64).set_requires_grad(true);
  r = gradcheck([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2]); }, {x, w1, b1});
  INFO(r.message);
  CHECK(r.ok);
  Tensor wd = seq({3, 1, 3, 3}, fw, DType::f64).set_requires_grad(true);
  r = gradcheck([](const std::vector<Tensor>& in) { return conv2d(narrow(in[0], 1, 2, 3), in[1], Tensor(), {1, 1, 3}); },
                {x, wd});
  INFO(r.message);
  CHECK(r.ok);
  // Only the weight needs a gradient (x is then saved, the weight is not) and vice versa.
  Tensor xc = seq({1, 4, 4, 4}, fx, DType::f64);
  Tensor wc = seq({4, 2, 3, 3}, fw, DType::f64).set_requires_grad(true);
  r = gradcheck([&](const std::vector<Tensor>& in) { return conv2d(xc, in[0], Tensor(), {1, 1, 2}); }, {wc});
  CHECK(r.ok);
}

TEST_CASE("conv2d on meta gives shapes and the same workspace as cpu", "[conv]") {
  Tensor x = empty({16, 32, 10, 10}, {.device = kMeta});
  Tensor w = empty({64, 16, 3, 3}, {.device = kMeta, .requires_grad = true});
  Tensor b = empty({64}, {.device = kMeta, .requires_grad = true});
  Tensor y = conv2d(x, w, b, {2, 1, 2});
  CHECK(y.shape() == Shape{16, 64, 5, 5});
  CHECK(y.is_meta());
  backward(sum(y));
  CHECK(w.grad().shape() == w.shape());
  CHECK(b.grad().shape() == b.shape());
  Tensor xd = empty({2, 8, 7, 7}, {.device = kMeta, .requires_grad = true});
  Tensor wd = empty({8, 1, 3, 3}, {.device = kMeta});
  Tensor yd = conv2d(xd, wd, Tensor(), {2, 1, 8});
  CHECK(yd.shape() == Shape{2, 8, 4, 4});
  backward(sum(yd));
  CHECK(xd.grad().shape() == xd.shape());

  // Workspace peak of one forward: a single image's columns, (Cin*KH*KW, OH*OW) f32, whatever
  // the batch, and identical on meta and cpu.
  auto workspace_peak = [](Device dev, int64_t batch, int64_t k) {
    Tensor xx = zeros({batch, 8, 6, 6}, {.device = dev});
    Tensor ww = zeros({4, 8, k, k}, {.device = dev});
    NoGradGuard ng;
    reset_peak_stats(dev);
    int64_t before = memory_stats(dev).category(MemoryCategory::workspace).current;
    conv2d(xx, ww, Tensor(), {1, k / 2, 1});
    return memory_stats(dev).category(MemoryCategory::workspace).peak - before;
  };
  const int64_t col_bytes = 8 * 9 * 36 * 4;  // 10368 B, rounded up to 512 B blocks
  CHECK(workspace_peak(Device(DeviceType::cpu, 5), 3, 3) == (col_bytes + 511) / 512 * 512);
  CHECK(workspace_peak(Device(DeviceType::cpu, 5), 12, 3) == (col_bytes + 511) / 512 * 512);
  CHECK(workspace_peak(kMeta, 12, 3) == (col_bytes + 511) / 512 * 512);
  CHECK(workspace_peak(Device(DeviceType::cpu, 5), 12, 1) == 0);  // pointwise: the GEMM reads x itself
  CHECK(workspace_peak(kMeta, 12, 1) == 0);
}

TEST_CASE("conv2d input errors name the op and the shapes", "[conv]") {
  Tensor x = zeros({1, 6, 5, 5});
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 2, 3, 3}), Tensor(), {1, 0, 4}),
                    Catch::Contains("conv2d: input channels 6 are not divisible by groups 4") &&
                        Catch::Contains("(1, 6, 5, 5)"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 4, 3, 3})),
                    Catch::Contains("conv2d: weight (4, 4, 3, 3) with groups 1 expects 4 input channels") &&
                        Catch::Contains("(1, 6, 5, 5) has 6"));
  CHECK_THROWS_WITH(conv2d(x, zeros({3, 3, 3, 3}), Tensor(), {1, 0, 2}),
                    Catch::Contains("output channels 3 are not divisible by groups 2"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 7, 7})),
                    Catch::Contains("conv2d: output size 0x0 is not positive") && Catch::Contains("(4, 6, 7, 7)"));
  CHECK_THROWS_WITH(conv2d(zeros({6, 5, 5}), zeros({4, 6, 3, 3})),
                    Catch::Contains("conv2d: input (N, Cin, H, W) must have 4 dimensions, got shape (6, 5, 5)"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}), zeros({5})),
                    Catch::Contains("conv2d: bias must have shape (4,)") && Catch::Contains("got (5,)"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}, {.device = Device("cpu:1")})),
                    Catch::Contains("conv2d: tensors are on different devices, cpu:0 and cpu:1"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}, {.dtype = DType::f64})), Catch::Contains("conv2d: dtypes differ"));
  CHECK_THROWS_WITH(conv2d(zeros({1, 6, 5, 5}, {.dtype = DType::i32}), zeros({4, 6, 3, 3}, {.dtype = DType::i32})),
                    Catch::Contains("conv2d: expected a floating tensor"));
  CHECK_THROWS_WITH(conv2d(x, zeros({4, 6, 3, 3}), Tensor(), {0, 0, 1}), Catch::Contains("conv2d: invalid parameters stride 0"));
}

TEST_CASE("conv2d f16 and bf16 forward and backward track f32", "[conv]") {
  struct Cfg {
    Shape xs, ws;
    Conv2dParams p;
  };
  for (const Cfg& c : {Cfg{{2, 4, 6, 5}, {6, 2, 3, 3}, {2, 1, 2}}, Cfg{{2, 4, 5, 5}, {4, 1, 3, 3}, {1, 1, 4}},
                       Cfg{{2, 4, 5, 5}, {3, 4, 1, 1}, {1, 0, 1}}})
    for (DType low : {DType::f16, DType::bf16}) {
      // Inputs rounded to the low type first, so only the op's own rounding is measured.
      Tensor x = cast(cast(seq(c.xs, fx), low), DType::f32).set_requires_grad(true);
      Tensor w = cast(cast(seq(c.ws, fw), low), DType::f32).set_requires_grad(true);
      Tensor b = cast(cast(seq({c.ws[0]}, fb), low), DType::f32).set_requires_grad(true);
      Tensor xl = cast(x.detach(), low).set_requires_grad(true);
      Tensor wl = cast(w.detach(), low).set_requires_grad(true);
      Tensor bl = cast(b.detach(), low).set_requires_grad(true);
      Tensor y = conv2d(x, w, b, c.p), yl = conv2d(xl, wl, bl, c.p);
      CHECK(yl.dtype() == low);
      const double tol = low == DType::f16 ? 2e-3 : 1.6e-2;  // a few ulps of the type at |y| <= ~3
      check_close(yl, y.to_vector<double>(), tol, tol);
      Tensor dout = seq(y.shape(), [](int64_t i) { return std::cos(0.7 * double(i)); });
      backward(y, dout);
      backward(yl, cast(dout, low));
      check_close(xl.grad(), x.grad().to_vector<double>(), tol, 2 * tol);
      check_close(wl.grad(), w.grad().to_vector<double>(), tol, 8 * tol);  // sums over N*OH*OW terms
      check_close(bl.grad(), b.grad().to_vector<double>(), tol, 8 * tol);
    }
}

TEST_CASE("conv2d gives the same bits with 1 and 2 threads", "[conv]") {
  // Shapes large enough for several GEMM tiles, im2col chunks and depthwise tasks.
  struct Cfg {
    int64_t groups, cout, cin_per_group, k;
  };
  auto run = [](int threads, const Cfg& c) {
    set_num_threads(threads);
    Tensor x = seq({2, 64, 16, 16}, fx).set_requires_grad(true);
    Tensor w = seq({c.cout, c.cin_per_group, c.k, c.k}, fw).set_requires_grad(true);
    Tensor b = seq({c.cout}, fb).set_requires_grad(true);
    Tensor y = conv2d(x, w, b, {1, c.k / 2, c.groups});
    backward(y, seq(y.shape(), [](int64_t i) { return std::cos(0.7 * double(i)); }));
    return std::vector<std::vector<double>>{y.to_vector<double>(), x.grad().to_vector<double>(),
                                            w.grad().to_vector<double>(), b.grad().to_vector<double>()};
  };
  const int saved = num_threads();
  for (const Cfg& c : {Cfg{1, 32, 64, 3}, Cfg{2, 32, 32, 3}, Cfg{64, 64, 1, 3}, Cfg{1, 300, 64, 1}}) {
    auto one = run(1, c);
    auto two = run(2, c);
    for (size_t k = 0; k < one.size(); ++k) {
      size_t diff = 0;
      for (size_t i = 0; i < one[k].size(); ++i) diff += one[k][i] != two[k][i];
      INFO("groups " << c.groups << " kernel " << c.k << " output " << k << ": " << diff << " of " << one[k].size()
                     << " differ");
      CHECK(diff == 0);
    }
  }
  set_num_threads(saved);
}

TEST_CASE("conv2d in f16/bf16 is the f32 conv of the same values rounded once, over staged groups", "[conv]") {
  // 5 images of 4 x 128 x 128: 64 Ki f32 values each, so a 512 KiB staging group holds 2 images
  // and the batch runs as groups of 2, 2 and 1 (ops/f32_staging.h). Pointwise and depthwise
  // convs stage whole groups; their f32 arithmetic is the f32 kernel's, so every output and
  // gradient equals the f32 result on the upcast values, rounded to the low type once.
  const Shape xs{5, 4, 128, 128};
  struct Cfg {
    Shape ws;
    Conv2dParams p;
  };
  for (const Cfg& c : {Cfg{{4, 4, 1, 1}, {1, 0, 1}}, Cfg{{4, 1, 3, 3}, {1, 1, 4}}})
    for (DType low : {DType::f16, DType::bf16}) {
      INFO("kernel " << c.ws[2] << " " << dtype_name(low));
      Tensor xl = cast(seq(xs, fx), low).set_requires_grad(true);
      Tensor wl = cast(seq(c.ws, fw), low).set_requires_grad(true);
      Tensor bl = cast(seq({4}, fb), low).set_requires_grad(true);
      Tensor x = cast(xl.detach(), DType::f32).set_requires_grad(true);
      Tensor w = cast(wl.detach(), DType::f32).set_requires_grad(true);
      Tensor b = cast(bl.detach(), DType::f32).set_requires_grad(true);
      Tensor yl = conv2d(xl, wl, bl, c.p), y = conv2d(x, w, b, c.p);
      Tensor doutl = cast(seq(y.shape(), [](int64_t i) { return std::cos(0.7 * double(i)); }), low);
      backward(yl, doutl);
      backward(y, cast(doutl, DType::f32));
      CHECK(yl.to_vector<double>() == cast(y, low).to_vector<double>());
      CHECK(xl.grad().to_vector<double>() == cast(x.grad(), low).to_vector<double>());
      CHECK(wl.grad().to_vector<double>() == cast(w.grad(), low).to_vector<double>());
      CHECK(bl.grad().to_vector<double>() == cast(b.grad(), low).to_vector<double>());
    }
  // The forward workspace of the pointwise bf16 conv: one group of x and of the output in f32
  // (2 images x 4 x 16384 x 4 B = 512 KiB each) plus f32 copies of the weight and bias (512 B blocks).
  Tensor xl = zeros(xs, {.dtype = DType::bf16}), wl = zeros({4, 4, 1, 1}, {.dtype = DType::bf16});
  Tensor bl = zeros({4}, {.dtype = DType::bf16});
  NoGradGuard ng;
  reset_peak_stats(kCPU);
  const int64_t before = memory_stats(kCPU).category(MemoryCategory::workspace).current;
  conv2d(xl, wl, bl);
  CHECK(memory_stats(kCPU).category(MemoryCategory::workspace).peak - before == 2 * (int64_t(512) << 10) + 2 * 512);
}
