// Tensor-parallel attention and MLP (see tensor_parallel.h), the conversion of a GPT's blocks into
// them, and the gather back to single-device names.
// Note [Tensor-parallel slices]: c_attn's rows are [q | k | v], each NH * HS long, head-major; shard
// d takes heads [d h, (d+1) h) of each of q, k and v (h = NH / N), i.e. three row blocks, and the
// columns [d h HS, (d+1) h HS) of c_proj. The MLP's shard d takes rows [d w, (d+1) w) of c_fc and
// the same columns of c_proj (w = 4C / N). Biases of c_attn / c_fc are sliced with their rows;
// c_proj's bias is added once, after the reduction.
#include "parallel/tensor_parallel.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "parallel/shard_comm.h"

namespace mg {
namespace {

// One device's pair of projections: c_attn + c_proj or c_fc + c_proj (c_proj without bias).
class ProjectionShard : public Module {
 public:
  ProjectionShard(const char* first, const Tensor& w_in, const Tensor& b_in, const Tensor& w_out, Device d)
      : Module("ProjectionShard") {
    Generator scratch(0);  // Linear's own init draws are overwritten below
    const InitOptions init{.gen = &scratch, .device = d, .dtype = w_in.dtype()};
    in = register_module(first, std::make_shared<Linear>(w_in.size(1), w_in.size(0), true, init));
    out = register_module("c_proj", std::make_shared<Linear>(w_out.size(1), w_out.size(0), false, init));
    NoGradGuard no_grad;
    MemoryCategoryGuard tag(MemoryCategory::parameter);
    copy_(in->weight.detach(), mg::to(contiguous(w_in), d));
    copy_(in->bias.detach(), mg::to(contiguous(b_in), d));
    copy_(out->weight.detach(), mg::to(contiguous(w_out), d));
  }
  std::shared_ptr<Linear> in, out;
};

Tensor bias_parameter(const Tensor& b, Device d) {
  NoGradGuard no_grad;
  MemoryCategoryGuard tag(MemoryCategory::parameter);
  return clone(to(b.detach(), d));
}

void check_plain_linear(const Linear& l, const std::string& path) {
  MG_CHECK(l.type_name() == "Linear" && l.bias.defined(), "--split tensor: ", path, " is a ", l.type_name(),
           "; tensor parallelism slices plain float Linear layers with a bias (split before quantizing)");
}

// x: (B, T, C) -> (B, T, C). Shard d runs heads [d h, (d+1) h) on devices[d].
class TensorParallelAttention : public CausalSelfAttention {
 public:
  TensorParallelAttention(const CausalSelfAttention& full, const std::string& path, const std::vector<Device>& devices)
      : CausalSelfAttention("TensorParallelAttention", full.n_head, full.head_size, full.attn_dropout),
        devices_(devices) {
    check_plain_linear(*full.c_attn, path + ".c_attn");
    check_plain_linear(*full.c_proj, path + ".c_proj");
    recompute_core = full.recompute_core;
    const int64_t N = int64_t(devices.size()), h = n_head / N, HS = head_size, inner = n_head * HS;
    shards = register_module("shards", std::make_shared<ModuleList>());
    for (int64_t d = 0; d < N; ++d) {
      std::vector<Tensor> w, b;  // Note [Tensor-parallel slices]
      for (int64_t part = 0; part < 3; ++part) {
        w.push_back(narrow(full.c_attn->weight.detach(), 0, part * inner + d * h * HS, h * HS));
        b.push_back(narrow(full.c_attn->bias.detach(), 0, part * inner + d * h * HS, h * HS));
      }
      const Tensor w_proj = narrow(full.c_proj->weight.detach(), 1, d * h * HS, h * HS);
      shards->push_back(std::make_shared<ProjectionShard>("c_attn", cat(w, 0), cat(b, 0), w_proj, devices[size_t(d)]));
    }
    c_proj_bias = register_parameter("c_proj_bias", bias_parameter(full.c_proj->bias, devices[0]));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(full.resid_dropout->p));
  }

  Tensor forward(const Tensor& x) override {
    auto scope = forward_scope();
    MG_CHECK(x.dim() == 3, "TensorParallelAttention: expected input (B, T, C), got ", x.shape());
    const int64_t B = x.size(0), T = x.size(1), HS = head_size, h = n_head / int64_t(devices_.size());
    const double p = is_training() ? attn_dropout : 0.0;
    const std::vector<Tensor> xs = broadcast_to_devices(x, devices_);  // f
    std::vector<Tensor> partial;
    for (size_t d = 0; d < devices_.size(); ++d) {
      auto& shard = *shards->at<ProjectionShard>(d);
      Tensor qkv = shard.in->forward(xs[d]);                   // (B, T, 3 h HS)
      std::vector<Tensor> parts = split(qkv, h * HS, 2);       // 3 x (B, T, h HS)
      auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, h, HS}), 1, 2); };
      Tensor y;
      if (recompute_core) {  // selective checkpointing, as CausalSelfAttention::forward
        y = checkpoint([p](const std::vector<Tensor>& in) {
              return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], /*causal=*/true, p)};
            }, {heads(parts[0]), heads(parts[1]), heads(parts[2])})[0];
      } else {
        y = scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), /*causal=*/true, p);
      }
      Tensor merged = reshape(transpose(y, 1, 2), {B, T, h * HS});  // (B, T, h HS)
      partial.push_back(shard.out->forward(merged));                // (B, T, C), a partial sum
    }
    Tensor out = add(reduce_to_device(partial, devices_[0]), c_proj_bias);  // g, then the bias once
    return resid_dropout->forward(out);
  }

  std::shared_ptr<ModuleList> shards;
  Tensor c_proj_bias;

 private:
  std::vector<Device> devices_;
};

// x: (B, T, C) -> (B, T, C). Shard d computes hidden units [d w, (d+1) w) on devices[d].
class TensorParallelMLP : public MLP {
 public:
  TensorParallelMLP(const MLP& full, const std::string& path, const std::vector<Device>& devices)
      : MLP("TensorParallelMLP"), devices_(devices) {
    check_plain_linear(*full.c_fc, path + ".c_fc");
    check_plain_linear(*full.c_proj, path + ".c_proj");
    const int64_t N = int64_t(devices.size()), w = full.c_fc->out_features / N;
    shards = register_module("shards", std::make_shared<ModuleList>());
    for (int64_t d = 0; d < N; ++d)
      shards->push_back(std::make_shared<ProjectionShard>(
          "c_fc", narrow(full.c_fc->weight.detach(), 0, d * w, w), narrow(full.c_fc->bias.detach(), 0, d * w, w),
          narrow(full.c_proj->weight.detach(), 1, d * w, w), devices[size_t(d)]));
    c_proj_bias = register_parameter("c_proj_bias", bias_parameter(full.c_proj->bias, devices[0]));
    dropout = register_module("dropout", std::make_shared<Dropout>(full.dropout->p));
  }

  Tensor forward(const Tensor& x) override {
    auto scope = forward_scope();
    const std::vector<Tensor> xs = broadcast_to_devices(x, devices_);  // f
    std::vector<Tensor> partial;
    for (size_t d = 0; d < devices_.size(); ++d) {
      auto& shard = *shards->at<ProjectionShard>(d);
      Tensor hidden = shard.in->forward(xs[d]);                           // (B, T, w)
      partial.push_back(gelu_linear(hidden, shard.out->weight, Tensor()));  // (B, T, C), a partial sum
    }
    return dropout->forward(add(reduce_to_device(partial, devices_[0]), c_proj_bias));  // g, bias once
  }

  std::shared_ptr<ModuleList> shards;
  Tensor c_proj_bias;

 private:
  std::vector<Device> devices_;
};

std::string devices_str(const std::vector<Device>& devices) {
  std::string s;
  for (const auto& d : devices) s += (s.empty() ? "" : ",") + d.str();
  return s;
}

}  // namespace

void check_tensor_parallel(const GPT& gpt, const std::vector<Device>& devices) {
  const int64_t N = int64_t(devices.size());
  MG_CHECK(N >= 2, "--split tensor needs at least two devices, got ", N, " (", devices_str(devices), ")");
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      MG_CHECK(devices[i] != devices[j], "--split tensor: device ", devices[i].str(), " is listed twice in ",
               devices_str(devices));
  const GPTConfig& cfg = gpt.config();
  std::vector<std::string> problems;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (cfg.heads(l) % N != 0)
      problems.push_back("layer " + std::to_string(l) + " has " + std::to_string(cfg.heads(l)) +
                         " attention heads, not divisible by " + std::to_string(N) + " devices");
    if (cfg.mlp_width(l) % N != 0)
      problems.push_back("layer " + std::to_string(l) + " has an MLP width of " + std::to_string(cfg.mlp_width(l)) +
                         " (d_ff), not divisible by " + std::to_string(N) + " devices");
  }
  if (problems.empty()) return;
  std::string msg = "--split tensor over " + devices_str(devices) + ": every block's heads and MLP width must split "
                    "evenly over the devices:";
  for (size_t i = 0; i < problems.size() && i < 8; ++i) msg += "\n  " + problems[i];
  if (problems.size() > 8) msg += "\n  ... and " + std::to_string(problems.size() - 8) + " more";
  MG_THROW(msg, "\n  hint: use a device count that divides n_head (", cfg.n_head, ")");
}

bool is_tensor_parallel(const GPT& gpt) {
  return gpt.h->size() > 0 && dynamic_cast<TensorParallelAttention*>(gpt.h->at<Block>(0)->attn.get()) != nullptr;
}

ResolvedPlacement apply_tensor_parallel(GPT& gpt, const std::vector<Device>& devices) {
  check_tensor_parallel(gpt, devices);
  MG_CHECK(!is_tensor_parallel(gpt), "--split tensor: the model is already split");
  Placement home;  // everything on the first device; the blocks' projections are then sliced
  home.entries = {{"wte", devices[0]}, {"wpe", devices[0]}, {"h", devices[0]}, {"ln_f", devices[0]}};
  ResolvedPlacement r = apply_placement(gpt, home);
  std::vector<std::pair<std::string, Device>> leaves;
  for (size_t l = 0; l < gpt.h->size(); ++l) {
    auto block = gpt.h->at<Block>(l);
    const std::string b = "h." + std::to_string(l);
    auto attn = std::make_shared<TensorParallelAttention>(*block->attn, b + ".attn", devices);
    auto mlp = std::make_shared<TensorParallelMLP>(*block->mlp, b + ".mlp", devices);
    attn->train(block->attn->is_training());
    mlp->train(block->mlp->is_training());
    block->replace_child("attn", attn);
    block->replace_child("mlp", mlp);
    block->attn = attn;  // the full-width layers are freed here
    block->mlp = mlp;
  }
  for (const auto& [leaf, d] : r.leaves) {
    leaves.emplace_back(leaf, d);
    const bool sharded = leaf.size() > 5 && (leaf.ends_with(".attn") || leaf.ends_with(".mlp"));
    if (!sharded) continue;
    for (size_t d2 = 0; d2 < devices.size(); ++d2) leaves.emplace_back(leaf + ".shards." + std::to_string(d2), devices[d2]);
  }
  r.leaves = std::move(leaves);
  return r;
}

NamedTensors gather_tensor_parallel(const GPT& gpt, Device device, bool grads) {
  MG_CHECK(is_tensor_parallel(gpt), "gather_tensor_parallel: the model is not split with --split tensor");
  auto get = [&](const Tensor& p) {
    const Tensor t = grads ? p.grad() : p.detach();
    MG_CHECK(t.defined(), "gather_tensor_parallel: a parameter has no gradient (run backward first)");
    return to(t, device);
  };
  NoGradGuard no_grad;
  NamedTensors out;
  for (const auto& [name, p] : gpt.named_parameters()) {
    if (name.find(".shards.") != std::string::npos || name.ends_with("c_proj_bias")) continue;
    out.emplace_back(name, get(p));
  }
  for (size_t l = 0; l < gpt.h->size(); ++l) {
    auto block = gpt.h->at<Block>(l);
    const std::string b = "h." + std::to_string(l);
    auto* attn = dynamic_cast<TensorParallelAttention*>(block->attn.get());
    auto* mlp = dynamic_cast<TensorParallelMLP*>(block->mlp.get());
    MG_INTERNAL_ASSERT(attn && mlp, "gather_tensor_parallel: block ", l, " is not tensor-parallel");
    const size_t N = attn->shards->size();
    const int64_t hHS = attn->n_head / int64_t(N) * attn->head_size;
    std::vector<Tensor> qkv_w, qkv_b, proj, fc_w, fc_b, fc_proj;
    for (int64_t part = 0; part < 3; ++part)  // Note [Tensor-parallel slices]: q of every shard, then k, then v
      for (size_t d = 0; d < N; ++d) {
        auto& s = *attn->shards->at<ProjectionShard>(d);
        qkv_w.push_back(narrow(get(s.in->weight), 0, part * hHS, hHS));
        qkv_b.push_back(narrow(get(s.in->bias), 0, part * hHS, hHS));
      }
    for (size_t d = 0; d < N; ++d) {
      proj.push_back(get(attn->shards->at<ProjectionShard>(d)->out->weight));
      auto& s = *mlp->shards->at<ProjectionShard>(d);
      fc_w.push_back(get(s.in->weight));
      fc_b.push_back(get(s.in->bias));
      fc_proj.push_back(get(s.out->weight));
    }
    out.emplace_back(b + ".attn.c_attn.weight", cat(qkv_w, 0));
    out.emplace_back(b + ".attn.c_attn.bias", cat(qkv_b, 0));
    out.emplace_back(b + ".attn.c_proj.weight", cat(proj, 1));
    out.emplace_back(b + ".attn.c_proj.bias", get(attn->c_proj_bias));
    out.emplace_back(b + ".mlp.c_fc.weight", cat(fc_w, 0));
    out.emplace_back(b + ".mlp.c_fc.bias", cat(fc_b, 0));
    out.emplace_back(b + ".mlp.c_proj.weight", cat(fc_proj, 1));
    out.emplace_back(b + ".mlp.c_proj.bias", get(mlp->c_proj_bias));
  }
  return out;
}

}  // namespace mg
