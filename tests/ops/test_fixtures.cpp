// Every op against PyTorch: tests/gen_fixtures.py stored inputs, outputs and input gradients
// (f64) in tests/fixtures/ops.safetensors; here memgrad runs the same op on the same inputs,
// backpropagates the same output gradient, and must agree to 1e-10 relative.
#include <catch2/catch.hpp>
#include <map>

#include "autograd/engine.h"
#include "core/safetensors.h"
#include "ops/ops.h"
#include "test_helpers.h"

using namespace mg;

namespace {

using Case = std::map<std::string, Tensor>;
using OpFn = std::function<Tensor(std::vector<Tensor>&, Case&)>;

std::map<std::string, Case> load_cases() {
  std::map<std::string, Case> cases;
  for (auto& [name, t] : load_safetensors(std::string(MG_FIXTURE_DIR) + "/ops.safetensors")) {
    auto dot = name.find('.');
    cases[name.substr(0, dot)][name.substr(dot + 1)] = t;
  }
  return cases;
}

Tensor unary(std::vector<Tensor>& in, Tensor (*f)(const Tensor&)) { return f(in[0]); }

const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table = {
      {"add_broadcast", [](auto& in, auto&) { return add(in[0], in[1]); }},
      {"sub_broadcast", [](auto& in, auto&) { return sub(in[0], in[1]); }},
      {"mul_broadcast", [](auto& in, auto&) { return mul(in[0], in[1]); }},
      {"div", [](auto& in, auto&) { return div(in[0], in[1]); }},
      {"pow", [](auto& in, auto&) { return pow(in[0], in[1]); }},
      {"maximum", [](auto& in, auto&) { return maximum(in[0], in[1]); }},
      {"exp", [](auto& in, auto&) { return unary(in, exp); }},
      {"log", [](auto& in, auto&) { return unary(in, log); }},
      {"tanh", [](auto& in, auto&) { return unary(in, tanh); }},
      {"sigmoid", [](auto& in, auto&) { return unary(in, sigmoid); }},
      {"relu", [](auto& in, auto&) { return unary(in, relu); }},
      {"gelu_tanh", [](auto& in, auto&) { return unary(in, gelu_tanh); }},
      {"silu", [](auto& in, auto&) { return unary(in, silu); }},
      {"relu6", [](auto& in, auto&) { return unary(in, relu6); }},
      {"sqrt", [](auto& in, auto&) { return unary(in, sqrt); }},
      {"rsqrt", [](auto& in, auto&) { return unary(in, rsqrt); }},
      {"abs", [](auto& in, auto&) { return unary(in, abs); }},
      {"sum_dims", [](auto& in, auto&) { return sum(in[0], {0, 2}); }},
      {"mean_keepdim", [](auto& in, auto&) { return mean(in[0], {1}, true); }},
      {"var", [](auto& in, auto&) { return var(in[0], {2}); }},
      {"amax", [](auto& in, auto&) { return amax(in[0], 1); }},
      {"matmul_2d", [](auto& in, auto&) { return matmul(in[0], in[1]); }},
      {"matmul_batched_broadcast", [](auto& in, auto&) { return matmul(in[0], in[1]); }},
      {"linear", [](auto& in, auto&) { return linear(in[0], in[1], in[2]); }},
      {"softmax", [](auto& in, auto&) { return softmax(in[0], -1); }},
      {"log_softmax_dim0", [](auto& in, auto&) { return log_softmax(in[0], 0); }},
      {"cross_entropy", [](auto& in, auto&) { return cross_entropy(in[0], in[1], -100); }},
      {"mse_loss", [](auto& in, auto&) { return mse_loss(in[0], in[1]); }},
      {"layer_norm", [](auto& in, auto&) { return layer_norm(in[0], in[1], in[2], 1e-5); }},
      {"batch_norm_train",
       [](auto& in, Case& c) {
         Tensor out = batch_norm(in[0], c["running_mean"], c["running_var"], in[1], in[2], true, 0.1, 1e-5);
         test::check_close(c["running_mean"], c["running_mean_after"], 1e-10, 1e-12);
         test::check_close(c["running_var"], c["running_var_after"], 1e-10, 1e-12);
         return out;
       }},
      {"batch_norm_eval",
       [](auto& in, Case& c) {
         return batch_norm(in[0], c["running_mean"], c["running_var"], in[1], in[2], false, 0.1, 1e-5);
       }},
      {"conv2d_s2_p1_g2",
       [](auto& in, auto&) { return conv2d(in[0], in[1], in[2], {.stride = 2, .padding = 1, .groups = 2}); }},
      {"conv2d_depthwise",
       [](auto& in, auto&) { return conv2d(in[0], in[1], Tensor(), {.stride = 1, .padding = 1, .groups = 6}); }},
      {"conv2d_1x1", [](auto& in, auto&) { return conv2d(in[0], in[1]); }},
      {"max_pool2d", [](auto& in, auto&) { return max_pool2d(in[0], {.kernel = 3, .stride = 2, .padding = 1}); }},
      {"avg_pool2d", [](auto& in, auto&) { return avg_pool2d(in[0], {.kernel = 2, .stride = 2}); }},
      {"global_avg_pool2d", [](auto& in, auto&) { return global_avg_pool2d(in[0]); }},
      {"embedding", [](auto& in, auto&) { return embedding(in[1], in[0]); }},
      {"attention_causal", [](auto& in, auto&) { return scaled_dot_product_attention(in[0], in[1], in[2], true); }},
      {"cat_dim1", [](auto& in, auto&) { return cat({in[0], in[1]}, 1); }},
      {"stack_dim0", [](auto& in, auto&) { return stack({in[0], in[1]}, 0); }},
  };
  return table;
}

}  // namespace

TEST_CASE("every op matches PyTorch's forward and backward", "[fixtures]") {
  auto cases = load_cases();
  REQUIRE(cases.size() == op_table().size());
  for (auto& [name, c] : cases) {
    INFO("case " << name);
    auto it = op_table().find(name);
    REQUIRE(it != op_table().end());
    std::vector<Tensor> in;
    for (int i = 0; c.count("in" + std::to_string(i)); ++i) {
      Tensor x = c["in" + std::to_string(i)];
      if (c.count("grad" + std::to_string(i))) x.set_requires_grad(true);
      in.push_back(x);
    }
    Tensor out = it->second(in, c);
    test::check_close(out, c["out"], 1e-10, 1e-12);
    if (!c.count("gout")) continue;
    backward(out, c["gout"]);
    for (size_t i = 0; i < in.size(); ++i) {
      std::string key = "grad" + std::to_string(i);
      if (!c.count(key)) continue;
      INFO("gradient of input " << i);
      REQUIRE(in[i].grad().defined());
      test::check_close(in[i].grad(), c[key], 1e-10, 1e-12);
    }
  }
}
