// CPU-vs-CUDA agreement (after ggml's test-backend-ops): every op runs on cpu:0 and on cuda:0
// from the same input values, and the outputs and the input gradients must agree: f32 within
// 1e-5 relative (plus a small absolute floor for sums that cancel), f64 within 1e-10, f16/bf16
// within their rounding. Integer, bool and index results, dropout masks and copies must be
// identical. Runs when MG_TEST_DEVICE=cuda and a GPU is present (scripts/gpu-check); otherwise
// every case says it was skipped and why.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/cuda/backend.h"
#include "core/rng.h"
#include "models/nn/layers.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "ops/ops.h"
#include "cuda_skip.h"
#ifdef MG_WITH_CUDA
#include "ops/cuda/launchers.h"
#endif

using namespace mg;
using Catch::Matchers::Contains;

namespace {


const Device kGPU(DeviceType::cuda, 0);

// The same values on any device: uniform in [lo, hi) from a seeded Philox stream.
Tensor rnd(const Shape& s, uint64_t seed, Device d, DType dt = DType::f32, double lo = -1, double hi = 1) {
  Generator g(seed);
  std::vector<double> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * double(g.uniform_at(i));
  return from_vector(v, s, {.dtype = dt, .device = d});
}

Tensor leaf(Tensor t) { return t.set_requires_grad(true); }

struct Tol {
  double rtol, atol;
};

Tol tol_for(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-10, 1e-12};
    case DType::f32: return {1e-5, 1e-6};
    case DType::f16: return {4e-3, 1e-3};
    case DType::bf16: return {2e-2, 4e-3};
    default: return {0, 0};  // exact
  }
}

// Compares what f returns on cpu:0 and on cuda:0, tensor by tensor (undefined ones must match).
void agree(const std::string& what, const std::function<std::vector<Tensor>(Device)>& f, double scale = 1.0) {
  std::vector<Tensor> ref = f(kCPU);
  std::vector<Tensor> got = f(kGPU);
  REQUIRE(ref.size() == got.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    INFO(what << ": result " << k);
    REQUIRE(ref[k].defined() == got[k].defined());
    if (!ref[k].defined()) continue;
    REQUIRE(got[k].device() == kGPU);
    REQUIRE(ref[k].shape() == got[k].shape());
    REQUIRE(ref[k].dtype() == got[k].dtype());
    std::vector<double> a = ref[k].to_double_vector(), b = got[k].to_double_vector();
    double amax = 0;
    for (double v : a) amax = std::max(amax, std::isfinite(v) ? std::abs(v) : 0.0);
    Tol t = tol_for(ref[k].dtype());
    const double atol = t.atol * scale * std::max(1.0, amax);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      if (std::abs(a[i] - b[i]) <= atol + t.rtol * scale * std::abs(a[i])) continue;
      FAIL_CHECK("element " << i << ": cpu " << a[i] << " vs cuda " << b[i]);
      break;
    }
  }
}

// loss = sum(out * w) for a fixed random w, so every gradient element is exercised.
Tensor weighted_sum(const Tensor& out, uint64_t seed) {
  Tensor w = rnd(out.shape(), seed, out.device(), out.dtype());
  return sum(mul(out, w));
}

// out, then the gradients of `inputs` after backward of weighted_sum(out).
std::vector<Tensor> with_grads(const Tensor& out, const std::vector<Tensor>& inputs, uint64_t seed = 99) {
  backward(weighted_sum(out, seed));
  std::vector<Tensor> r{out};
  for (const Tensor& t : inputs) r.push_back(t.grad());
  return r;
}

}  // namespace

TEST_CASE("cuda agreement: fill, copy, cast, contiguous, to and accumulate", "[cuda]") {
  MG_REQUIRE_CUDA();
  agree("copies", [](Device d) {
    Tensor x = rnd({4, 5, 6}, 1, d, DType::f32, -300, 300);
    Tensor g = rnd({5, 6}, 2, d);
    Tensor acc = zeros({4, 5, 6}, {.device = d});
    accumulate_(acc, x);
    accumulate_(transpose(acc, 0, 2), transpose(x, 0, 2));
    Tensor z = zeros({3, 8}, {.dtype = DType::bf16, .device = d});
    copy_(narrow(z, 1, 2, 5), select(narrow(cast(x, DType::bf16), 0, 0, 3), 2, 1));
    fill_(narrow(z, 1, 0, 1), -1.25);
    return std::vector<Tensor>{contiguous(permute(x, {2, 0, 1})), cast(x, DType::f16), cast(x, DType::bf16),
                               cast(x, DType::f64), cast(x, DType::i32), cast(div(abs(x), 2.0), DType::u8),
                               cast(x, DType::b8),
                               clone(transpose(g, 0, 1)), acc, z, cast(cast(x, DType::i64), DType::f32)};
  });
}

TEST_CASE("cuda agreement: unary ops, forward and backward, every float dtype", "[cuda]") {
  MG_REQUIRE_CUDA();
  using U = Tensor (*)(const Tensor&);
  const std::vector<std::pair<const char*, U>> ops = {
      {"neg", mg::neg}, {"exp", mg::exp},   {"log", mg::log},         {"sqrt", mg::sqrt},
      {"rsqrt", mg::rsqrt}, {"abs", mg::abs}, {"tanh", mg::tanh},     {"sigmoid", mg::sigmoid},
      {"relu", mg::relu}, {"relu6", mg::relu6}, {"gelu_tanh", mg::gelu_tanh}, {"silu", mg::silu}};
  for (const auto& op : ops) {  // not a structured binding: clang 14 cannot capture one
    const char* name = op.first;
    const auto f = op.second;
    const bool positive = std::string(name) == "log" || std::string(name).find("sqrt") != std::string::npos;
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      agree(std::string(name) + " " + std::string(dtype_name(dt)), [&](Device d) {
        Tensor x = leaf(rnd({7, 33}, 3, d, dt, positive ? 0.1 : -8, positive ? 4 : 8));
        Tensor xt = transpose(x, 0, 1);  // the strided path too
        return with_grads(add(f(x), sum(f(xt), {1})), {x});  // (7, 33) + (33)
      });
    }
  }
}

TEST_CASE("cuda agreement: binary ops with broadcasting, scalar forms, comparisons and where", "[cuda]") {
  MG_REQUIRE_CUDA();
  using B = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<const char*, B>> ops = {{"add", mg::add}, {"sub", mg::sub}, {"mul", mg::mul},
                                                      {"div", mg::div}, {"pow", mg::pow}, {"maximum", mg::maximum},
                                                      {"minimum", mg::minimum}};
  for (const auto& op : ops) {  // not a structured binding: clang 14 cannot capture one
    const char* name = op.first;
    const auto f = op.second;
    for (DType dt : {DType::f32, DType::f16}) {
      agree(std::string(name) + " " + std::string(dtype_name(dt)), [&](Device d) {
        Tensor a = leaf(rnd({4, 1, 6}, 4, d, dt, 0.5, 2));  // positive bases for pow
        Tensor b = leaf(rnd({5, 1}, 5, d, dt, 0.5, 2));
        return with_grads(f(a, b), {a, b});
      });
    }
  }
  agree("scalar forms", [](Device d) {
    Tensor x = leaf(rnd({3, 70}, 6, d, DType::f32, 0.2, 3));
    Tensor y = add(mul(sub(add(x, 1.5), 0.25), 3.0), div(rsub(2.0, x), 4.0));
    y = add(y, add(rdiv(1.0, x), pow(x, 2.5)));
    return with_grads(y, {x});
  });
  agree("integers", [](Device d) {
    Tensor a = cast(rnd({6, 9}, 7, d, DType::f32, -50, 50), DType::i32);
    Tensor b = cast(rnd({9}, 8, d, DType::f32, -50, 50), DType::i32);
    return std::vector<Tensor>{add(a, b), mul(a, b), maximum(a, b), neg(a), add(a, 3.0), sub(a, b)};
  });
  agree("comparisons and where", [](Device d) {
    Tensor a = cast(rnd({4, 6}, 9, d, DType::f32, -3, 3), DType::i64);  // integers: ties happen
    Tensor b = cast(rnd({6}, 10, d, DType::f32, -3, 3), DType::i64);
    Tensor x = leaf(rnd({4, 6}, 11, d)), y = leaf(rnd({1, 6}, 12, d));
    Tensor c = lt(a, b);
    Tensor w = where(c, x, y);
    Tensor m = masked_fill(x, gt(x, 0.5), -100.0);
    std::vector<Tensor> r = with_grads(add(w, m), {x, y});
    for (Tensor t : {eq(a, b), ne(a, b), le(a, b), ge(a, b), gt(a, b), c, eq(x, 0.0), lt(x, 0.1)}) r.push_back(t);
    return r;
  });
}

TEST_CASE("cuda agreement: reductions (rows, columns, slices), amax and argmax", "[cuda]") {
  MG_REQUIRE_CUDA();
  agree("sums", [](Device d) {
    Tensor x = leaf(rnd({8, 50, 33}, 13, d));
    Tensor big = rnd({3000, 40}, 14, d);     // leading dims: the column kernel with slices
    Tensor all = rnd({200000}, 15, d);       // one output: row slices and a second pass
    Tensor xt = transpose(x, 0, 2);          // strided input
    std::vector<Tensor> r = with_grads(add(sum(x, {1}, true), mean(x, {0, 1}, true)), {x});
    for (Tensor t : {sum(big, {0}), sum(big, {1}), sum(all), mean(all), sum(xt, {0, 2}), var(big, {0}),
                     sum(x.detach()), sum(cast(gt(big, 0.0), DType::b8), {0}), sum(cast(mul(big, 100.0), DType::i32), {1})})
      r.push_back(t);
    return r;
  }, 3.0);
  agree("amax, argmax, max", [](Device d) {
    Tensor x = leaf(rnd({6, 40, 7}, 16, d));
    Tensor ties = cast(rnd({5, 300}, 17, d, DType::f32, 0, 4), DType::i32);
    std::vector<Tensor> r = with_grads(amax(x, 1), {x});
    for (Tensor t : {argmax(x, 1), argmax(x, -1, true), argmax(transpose(x, 0, 1), 0), max(x.detach()),
                     argmax(ties, 1), amax(ties, 0)})
      r.push_back(t);
    return r;
  });
}

TEST_CASE("cuda agreement: softmax and log_softmax over any dim, with masked rows", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    agree(std::string("softmax ") + std::string(dtype_name(dt)), [&](Device d) {
      Tensor x = leaf(rnd({4, 37, 300}, 18, d, dt, -6, 6));
      Tensor masked = masked_fill(x, gt(rnd({4, 37, 300}, 19, d, dt), 0.3), -INFINITY);
      Tensor y = add(add(softmax(masked, -1), log_softmax(x, 1)), softmax(x, 0));
      return with_grads(y, {x});
    });
  }
  // A GPT-2-sized row: the gradient 1 - n·p (n = 50257) cancels, so one ulp of the f32
  // log-sum-exp (|lse| ~ 17, ulp ~ 2e-6) shows as ~2e-6 absolute on both devices (measured on an
  // H200: 1.9e-6 at element 50838); the tolerance is scaled for that conditioning.
  agree("long rows", [](Device d) {
    Tensor x = leaf(rnd({3, 50257}, 20, d, DType::f32, -10, 10));
    return with_grads(log_softmax(x, 1), {x});
  }, 4.0);
}

TEST_CASE("cuda agreement: cross_entropy (ignore_index, i32/i64 targets) and mse_loss", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (DType it : {DType::i64, DType::i32}) {
    agree("cross_entropy", [&](Device d) {
      Tensor logits = leaf(rnd({64, 257}, 21, d, DType::f32, -5, 5));
      Tensor t = cast(rnd({64}, 22, d, DType::f32, 0, 257), it);
      t = where(lt(rnd({64}, 23, d), -0.7), full({}, -100, {.dtype = it, .device = d}), t);
      Tensor loss = cross_entropy(logits, t, -100);
      backward(mul(loss, 3.0));
      Tensor lt_ = leaf(rnd({40, 9}, 24, d, DType::f64));
      Tensor loss2 = cross_entropy(transpose(transpose(lt_, 0, 1), 0, 1), cast(rnd({40}, 25, d, DType::f32, 0, 9), it));
      backward(loss2);
      return std::vector<Tensor>{loss, logits.grad(), loss2, lt_.grad()};
    });
  }
  agree("mse_loss", [](Device d) {
    Tensor a = leaf(rnd({30, 70}, 26, d)), b = leaf(rnd({30, 70}, 27, d));
    Tensor l = mse_loss(a, b);
    backward(l);
    return std::vector<Tensor>{l, a.grad(), b.grad(), mse_loss(cast(a.detach(), DType::bf16), cast(b.detach(), DType::bf16))};
  });
  Tensor logits = rnd({4, 5}, 28, kGPU);
  Tensor bad = from_vector(std::vector<double>{0, 1, 7, 2}, {4}, {.dtype = DType::i64, .device = kGPU});
  CHECK_THROWS_WITH(cross_entropy(logits, bad), Contains("target 7 at position 2 is out of range [0, 5)"));
}

TEST_CASE("cuda agreement: layer_norm, batch_norm and batch_norm_relu6, forward, backward and running statistics", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64, DType::f16}) {
    agree(std::string("layer_norm ") + std::string(dtype_name(dt)), [&](Device d) {
      Tensor x = leaf(rnd({3, 45, 96}, 29, d, dt, -3, 3));
      Tensor w = leaf(rnd({96}, 30, d, dt)), b = leaf(rnd({96}, 31, d, dt));
      return with_grads(add(layer_norm(x, w, b), layer_norm(x, Tensor(), Tensor(), 1e-3)), {x, w, b});
    });
  }
  for (bool training : {true, false}) {
    agree(training ? "batch_norm training" : "batch_norm eval", [&](Device d) {
      Tensor x = leaf(rnd({6, 5, 7, 9}, 32, d, DType::f32, -2, 3));
      Tensor w = leaf(rnd({5}, 33, d)), b = leaf(rnd({5}, 34, d));
      Tensor rm = rnd({5}, 35, d), rv = rnd({5}, 36, d, DType::f32, 0.5, 2);
      Tensor y = batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
      std::vector<Tensor> r = with_grads(y, {x, w, b});
      r.push_back(rm);
      r.push_back(rv);
      Tensor x2 = rnd({16, 11}, 37, d);
      r.push_back(batch_norm(x2, Tensor(), Tensor(), Tensor(), Tensor(), true));
      return r;
    });
    // The fused BN + ReLU6: outputs spread over both clamp edges.
    agree(training ? "batch_norm_relu6 training" : "batch_norm_relu6 eval", [&](Device d) {
      Tensor x = leaf(rnd({6, 5, 7, 9}, 38, d, DType::f32, -3, 9));
      Tensor w = leaf(rnd({5}, 39, d, DType::f32, 0.5, 4)), b = leaf(rnd({5}, 40, d, DType::f32, -1, 5));
      Tensor rm = rnd({5}, 41, d), rv = rnd({5}, 42, d, DType::f32, 0.5, 2);
      std::vector<Tensor> r = with_grads(batch_norm_relu6(x, rm, rv, w, b, training, 0.1, 1e-5), {x, w, b});
      r.push_back(rm);
      r.push_back(rv);
      return r;
    });
  }
}

TEST_CASE("cuda agreement: matmul and linear (batched, broadcast, transposed, 16-bit)", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    agree(std::string("matmul ") + std::string(dtype_name(dt)), [&](Device d) {
      Tensor a = leaf(rnd({2, 3, 17, 33}, 38, d, dt)), b = leaf(rnd({3, 33, 9}, 39, d, dt));
      Tensor c = leaf(rnd({33, 17}, 40, d, dt));  // used transposed
      Tensor bb = leaf(rnd({2, 1, 33, 9}, 41, d, dt));  // broadcast in a middle dim: pointer arrays
      Tensor y = add(add(matmul(a, b), matmul(a, bb)), sum(matmul(transpose(c, 0, 1), b), {0}));
      std::vector<Tensor> r = with_grads(y, {a, b, c, bb});
      Tensor v = rnd({33}, 42, d, dt);
      r.push_back(matmul(c.detach(), rnd({17}, 43, d, dt)));
      r.push_back(matmul(v, b.detach()));
      return r;
    }, 4.0);
    agree(std::string("linear ") + std::string(dtype_name(dt)), [&](Device d) {
      Tensor x = leaf(rnd({4, 7, 48}, 44, d, dt)), w = leaf(rnd({20, 48}, 45, d, dt)), b = leaf(rnd({20}, 46, d, dt));
      Tensor y = add(linear(x, w, b), transpose(linear(transpose(x, 0, 1), w), 0, 1));  // strided x too
      return with_grads(y, {x, w, b});
    }, 4.0);
  }
}

// The default (flash) path on both devices, and the math path (strided-batched GEMMs on cuda:0);
// tests/ops/test_cuda_flash_attention.cpp has the flash kernels' own cases.
TEST_CASE("cuda agreement: attention with causal masks and dropout on the flash and the math paths", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (auto* attn : {&scaled_dot_product_attention, &scaled_dot_product_attention_math}) {
    for (double p : {0.0, 0.2}) {
      for (bool causal : {true, false}) {
        agree(attn == &scaled_dot_product_attention ? "attention" : "attention math", [&](Device d) {
          Tensor q = leaf(rnd({2, 3, 19, 8}, 47, d)), k = leaf(rnd({2, 3, 19, 8}, 48, d));
          Tensor v = leaf(rnd({2, 3, 19, 8}, 49, d));
          Generator g(1234);
          return with_grads(attn(q, k, v, causal, p, &g), {q, k, v});
        });
      }
    }
  }
}

TEST_CASE("cuda agreement: embedding (deterministic backward), dropout masks, cat/stack/split", "[cuda]") {
  MG_REQUIRE_CUDA();
  for (DType it : {DType::i64, DType::i32}) {
    agree("embedding", [&](Device d) {
      Tensor w = leaf(rnd({50, 24}, 50, d));
      Tensor idx = cast(rnd({6, 40}, 51, d, DType::f32, 0, 50), it);  // many repeats
      return with_grads(embedding(w, idx), {w});
    });
  }
  // Same bits on every run: the scatter-add order is fixed.
  Tensor w = leaf(rnd({300, 64}, 52, kGPU, DType::f32));
  Tensor idx = cast(rnd({4096}, 53, kGPU, DType::f32, 0, 300), DType::i64);
  backward(weighted_sum(embedding(w, idx), 54));
  std::vector<double> first = w.grad().to_double_vector();
  w.set_grad(Tensor());
  backward(weighted_sum(embedding(w, idx), 54));
  CHECK(w.grad().to_double_vector() == first);
  Tensor bad = from_vector(std::vector<double>{1, 2, 300}, {3}, {.dtype = DType::i64, .device = kGPU});
  CHECK_THROWS_WITH(embedding(w, bad), Contains("index 300 at position 2 is out of range"));

  agree("dropout", [](Device d) {
    Tensor x = leaf(rnd({5, 1001}, 55, d));  // odd sizes: Philox blocks straddle calls
    Generator g(77);
    g.advance(3);
    Tensor y = dropout(x, 0.3, true, &g);
    return with_grads(add(y, dropout(x, 0.5, true, &g)), {x});
  });
  agree("cat, stack, split", [](Device d) {
    Tensor a = leaf(rnd({3, 4}, 56, d)), b = leaf(rnd({3, 2}, 57, d));
    std::vector<Tensor> parts = split(cat({a, b, a}, 1), 3, 1);
    Tensor y = add(stack({parts[0], parts[1]}, 0), 0.0);
    return with_grads(y, {a, b});
  });
}

TEST_CASE("cuda agreement: conv2d on cuDNN (groups, stride, padding, bias) and pooling", "[cuda]") {
  MG_REQUIRE_CUDA();
#ifdef MG_WITH_CUDA
  if (!cuda::have_cudnn()) {
    WARN("skipped: this build has no cuDNN");
    return;
  }
#endif
  struct Case {
    int64_t cin, cout, k, stride, pad, groups;
  };
  for (Case c : {Case{3, 8, 3, 1, 1, 1}, Case{8, 8, 3, 2, 1, 8}, Case{6, 12, 1, 1, 0, 1}, Case{4, 6, 3, 1, 0, 2}}) {
    agree("conv2d", [&](Device d) {
      Tensor x = leaf(rnd({2, c.cin, 9, 11}, 58, d));
      Tensor w = leaf(rnd({c.cout, c.cin / c.groups, c.k, c.k}, 59, d));
      Tensor b = leaf(rnd({c.cout}, 60, d));
      return with_grads(conv2d(x, w, b, {.stride = c.stride, .padding = c.pad, .groups = c.groups}), {x, w, b});
    }, 3.0);
  }
  agree("pooling", [](Device d) {
    Tensor x = leaf(rnd({2, 3, 9, 10}, 61, d));
    Tensor y1 = max_pool2d(x, {.kernel = 3, .stride = 2, .padding = 1});
    Tensor y2 = avg_pool2d(x, {.kernel = 2});
    Tensor y3 = global_avg_pool2d(x);
    Tensor loss = add(add(weighted_sum(y1, 1), weighted_sum(y2, 2)), weighted_sum(y3, 3));
    backward(loss);
    return std::vector<Tensor>{y1, y2, y3, x.grad()};
  });
}

TEST_CASE("cuda agreement: fused AdamW and SGD updates follow the CPU's formula", "[cuda]") {
  MG_REQUIRE_CUDA();
#ifdef MG_WITH_CUDA
  const int64_t n = 1000;
  Tensor w = rnd({n}, 62, kCPU), g = rnd({n}, 63, kCPU), m = rnd({n}, 64, kCPU), v = rnd({n}, 65, kCPU, DType::f32, 0, 1);
  const cuda::AdamStep s{.lr = 1e-2, .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .bias_correction1 = 1 - 0.9 * 0.9, .bias_correction2_sqrt = std::sqrt(1 - 0.999 * 0.999),
                         .decoupled = true};
  Tensor wg = mg::to(w, kGPU), gg = mg::to(g, kGPU), mg_ = mg::to(m, kGPU), vg = mg::to(v, kGPU);
  cuda::adam_step(wg, gg, mg_, vg, Tensor(), s);
  // The CPU reference, written out as optim/adam.cpp computes it.
  std::vector<double> W = w.to_double_vector(), G = g.to_double_vector(), M = m.to_double_vector(), V = v.to_double_vector();
  for (int64_t i = 0; i < n; ++i) {
    float wi = float(W[i]) * float(1 - s.lr * s.weight_decay), d = float(G[i]);
    float mi = float(M[i]) + float(1 - s.beta1) * (d - float(M[i]));
    float vi = float(V[i]) * float(s.beta2) + float(1 - s.beta2) * d * d;
    float denom = std::sqrt(vi) / float(s.bias_correction2_sqrt) + float(s.eps);
    W[i] = wi - float(s.lr / s.bias_correction1) * (mi / denom), M[i] = mi, V[i] = vi;
  }
  auto close = [](const std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] - b[i]) > 1e-6 * (1 + std::abs(b[i]))) return false;
    return true;
  };
  CHECK(close(wg.to_double_vector(), W));
  CHECK(close(mg_.to_double_vector(), M));
  CHECK(close(vg.to_double_vector(), V));
  // SGD with momentum on a bf16 parameter through its f32 master.
  Tensor p16 = mg::to(cast(w, DType::bf16), kGPU), master = mg::to(cast(cast(w, DType::bf16), DType::f32), kGPU);
  Tensor g16 = mg::to(cast(g, DType::bf16), kGPU), buf = zeros({n}, {.device = kGPU});
  const cuda::SgdStep sg{.lr = 0.1, .weight_decay = 0, .momentum = 0.9, .dampening = 0, .nesterov = false, .first = true};
  cuda::sgd_step(master, g16, buf, p16, sg);
  std::vector<double> P = cast(cast(w, DType::bf16), DType::f32).to_double_vector(), G16 = cast(g, DType::bf16).to_double_vector();
  for (int64_t i = 0; i < n; ++i) P[i] = float(P[i]) - float(0.1) * float(G16[i]);
  CHECK(close(master.to_double_vector(), P));
  CHECK(close(buf.to_double_vector(), G16));
  CHECK(p16.to_double_vector() == cast(master, DType::bf16).to_double_vector());  // the master, rounded
#endif
}

TEST_CASE("cuda agreement: memory is accounted on cuda:0 as on cpu", "[cuda]") {
  MG_REQUIRE_CUDA();
  const Device d = kGPU;
  reset_peak_stats(d);
  const int64_t ws0 = memory_stats(d).category(MemoryCategory::workspace).peak;
  Tensor a = rnd({256, 256}, 66, d), b = rnd({256, 256}, 67, d);
  Tensor c = matmul(a, b);  // the cuBLAS workspace is an allocator block tagged workspace
  CHECK(memory_stats(d).category(MemoryCategory::workspace).peak > ws0);
  CHECK(memory_stats(d).category(MemoryCategory::workspace).current == 0);
  // A budget too small for an op is an OutOfMemoryError, and the device keeps working after it.
  // (The budget counts reserved bytes: drop the cache first, so the 4 MiB needs a new segment.)
  empty_cache(d);
  set_memory_limit(d, size_t(memory_stats(d).reserved.current) + (size_t(1) << 20));
  CHECK_THROWS_AS(rnd({1024, 1024}, 68, d), OutOfMemoryError);
  set_memory_limit(d, 0);
  CHECK(sum(c).item_double() == Approx(sum(mg::to(c, kCPU)).item_double()).epsilon(1e-5));
}

TEST_CASE("cuda agreement: Adam, AdamW and SGD steps (f32, bf16 masters), clip_grad_norm, BatchNorm counter",
          "[cuda]") {
  MG_REQUIRE_CUDA();
  // Three steps of each optimizer class through Optimizer::step on cuda:0 against cpu:0, with the
  // gradients clipped first: the weights, the state and the masters must agree.
  for (int kind = 0; kind < 3; ++kind) {
    for (DType dt : {DType::f32, DType::bf16}) {
      agree(std::string(kind == 0 ? "Adam " : kind == 1 ? "AdamW " : "SGD ") + std::string(dtype_name(dt)), [&](Device d) {
        NamedTensors params{{"w", leaf(rnd({33, 20}, 70, d, dt))}, {"b", leaf(rnd({20}, 71, d, dt))}};
        std::unique_ptr<Optimizer> opt;
        if (kind == 0) opt = std::make_unique<Adam>(params, 1e-2, 0.1);
        else if (kind == 1) opt = std::make_unique<AdamW>(params, 1e-2, 0.1);
        else opt = std::make_unique<SGD>(params, 1e-1, 0.01, SgdOptions{.momentum = 0.9, .nesterov = true});
        std::vector<Tensor> r;
        for (int step = 0; step < 3; ++step) {
          Tensor x = rnd({5, 33}, 72 + step, d, dt);
          backward(weighted_sum(add(matmul(x, params[0].second), params[1].second), 80 + step));
          r.push_back(from_vector(std::vector<double>{clip_grad_norm(params, 0.5)}, {}, {.device = d}));
          opt->step();
          opt->zero_grad();
        }
        // 16-bit gradients may differ by a rounding step between devices: judge the f32 state
        // of a bf16 parameter at bf16's precision.
        // The step counters are host integers on every device (as PyTorch's non-capturable step).
        for (const auto& [name, t] : opt->state_dict()) {
          if (name.ends_with(".step")) {
            CHECK(t.device() == kCPU);
            r.push_back(to(t, d));
          } else {
            r.push_back(dt == DType::f32 ? t : cast(t, dt));
          }
        }
        r.push_back(params[0].second.detach());
        r.push_back(params[1].second.detach());
        return r;
      }, 4.0);
    }
  }
  agree("BatchNorm2d module", [](Device d) {
    BatchNorm2d bn(4, 1e-5, 0.1, {.device = d});
    for (int i = 0; i < 3; ++i) bn.forward(rnd({2, 4, 3, 3}, 90 + i, d));
    return std::vector<Tensor>{bn.num_batches_tracked, bn.running_mean, bn.running_var};
  });
}
