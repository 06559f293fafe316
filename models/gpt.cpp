// GPT-2: configuration (named workloads, JSON), the layers (attention, MLP, block), the model's
// forward to logits and loss, and GPT-2's initialisation. Sampling with the KV cache lives in
// gpt_generate.cpp, reading Hugging Face weights in gpt_hf.cpp.
// Shapes: B batch, T time, C d_model, NH heads, HS head size, V vocab, Vp padded vocab.
#include "models/gpt.h"

#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "models/nn/init.h"
#include "ops/autocast_policy.h"

namespace mg {
namespace {

constexpr int64_t kVocabMultiple = 128;  // llm.c's padding: 50257 -> 50304
constexpr double kInitStd = 0.02;        // GPT-2's N(0, 0.02^2)

// A Linear initialised as GPT-2: weight ~ N(0, std^2), bias 0. The Linear constructor's own
// (PyTorch default) draws come from a scratch generator, so `init`'s stream holds exactly the
// GPT-2 draws and a model's weights depend only on its seed and config.
std::shared_ptr<Linear> gpt2_linear(int64_t in, int64_t out, double std, const InitOptions& init) {
  Generator scratch(0);
  InitOptions tmp = init;
  tmp.gen = &scratch;
  auto fc = std::make_shared<Linear>(in, out, true, tmp);
  normal_(fc->weight, 0.0, std, init.generator());
  fill_(fc->bias, 0.0);
  return fc;
}

// GPT-2 scales the residual projections by 1/sqrt(2 n_layer): each block adds two branches.
double residual_std(const GPTConfig& cfg) { return kInitStd / std::sqrt(2.0 * double(cfg.n_layer)); }

}  // namespace

// ---- configuration --------------------------------------------------------------------------

int64_t GPTConfig::padded_vocab() const {
  return (vocab_size + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
}

std::vector<std::string> GPTConfig::names() { return {"gpt-mini", "gpt-small", "gpt2-124m"}; }

GPTConfig GPTConfig::named(const std::string& name) {
  if (name == "gpt-mini") return GPTConfig{.vocab_size = 256, .context = 128, .n_layer = 4, .n_head = 4, .d_model = 256};
  if (name == "gpt-small") return GPTConfig{.vocab_size = 256, .context = 256, .n_layer = 8, .n_head = 8, .d_model = 512};
  if (name == "gpt2-124m")
    return GPTConfig{.vocab_size = 50257, .context = 1024, .n_layer = 12, .n_head = 12, .d_model = 768};
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  MG_THROW("GPTConfig: unknown configuration '", name, "' (known: ", known, ")");
}

void GPTConfig::validate() const {
  MG_CHECK(vocab_size > 0 && context > 0 && n_layer > 0 && n_head > 0 && d_model > 0,
           "GPTConfig: sizes must be positive, got vocab_size ", vocab_size, ", context ", context, ", n_layer ",
           n_layer, ", n_head ", n_head, ", d_model ", d_model);
  MG_CHECK(d_model % n_head == 0, "GPTConfig: d_model ", d_model, " is not divisible by n_head ", n_head);
  MG_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: dropout must be in [0, 1), got ", dropout);
  auto check_widths = [&](const std::vector<int64_t>& w, const char* name, int64_t full) {
    if (w.empty()) return;
    MG_CHECK(int64_t(w.size()) == n_layer, "GPTConfig: ", name, " must list one width per layer (", n_layer,
             "), got ", w.size());
    for (size_t l = 0; l < w.size(); ++l)
      MG_CHECK(w[l] > 0 && w[l] <= full, "GPTConfig: ", name, "[", l, "] must be in [1, ", full, "], got ", w[l]);
  };
  check_widths(mlp_hidden, "mlp_hidden", 4 * d_model);
  check_widths(layer_heads, "layer_heads", n_head);
}

int64_t GPTConfig::mlp_width(int64_t layer) const { return mlp_hidden.empty() ? 4 * d_model : mlp_hidden.at(size_t(layer)); }
int64_t GPTConfig::heads(int64_t layer) const { return layer_heads.empty() ? n_head : layer_heads.at(size_t(layer)); }

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = {{"vocab_size", vocab_size}, {"context", context}, {"n_layer", n_layer},
                      {"n_head", n_head},         {"d_model", d_model}, {"dropout", dropout}};
  if (!mlp_hidden.empty()) j["mlp_hidden"] = mlp_hidden;  // only pruned models carry these
  if (!layer_heads.empty()) j["layer_heads"] = layer_heads;
  return j;
}

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  MG_CHECK(j.is_object(), "GPTConfig.from_json: expected a JSON object, got ", j.dump());
  GPTConfig c;
  for (const auto& [key, value] : j.items()) {
    if (key == "mlp_hidden" || key == "layer_heads") {
      MG_CHECK(value.is_array(), "GPTConfig.from_json: '", key, "' must be an array of integers, got ", value.dump());
      auto& dst = key == "mlp_hidden" ? c.mlp_hidden : c.layer_heads;
      for (const auto& v : value) {
        MG_CHECK(v.is_number_integer(), "GPTConfig.from_json: '", key, "' must hold integers, got ", v.dump());
        dst.push_back(v.get<int64_t>());
      }
      continue;
    }
    MG_CHECK(key == "dropout" ? value.is_number() : value.is_number_integer(), "GPTConfig.from_json: '", key,
             "' must be ", key == "dropout" ? "a number" : "an integer", ", got ", value.dump());
    if (key == "vocab_size") c.vocab_size = value.get<int64_t>();
    else if (key == "context") c.context = value.get<int64_t>();
    else if (key == "n_layer") c.n_layer = value.get<int64_t>();
    else if (key == "n_head") c.n_head = value.get<int64_t>();
    else if (key == "d_model") c.d_model = value.get<int64_t>();
    else if (key == "dropout") c.dropout = value.get<double>();
    else MG_THROW("GPTConfig.from_json: unknown key '", key, "' (known: vocab_size, context, n_layer, n_head, d_model, dropout, "
                  "mlp_hidden, layer_heads)");
  }
  c.validate();
  return c;
}

// ---- layers ----------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, int64_t layer, const InitOptions& init)
    : UnaryModule("CausalSelfAttention"), n_head(cfg.heads(layer)), head_size(cfg.head_size()),
      attn_dropout(cfg.dropout) {
  const int64_t inner = n_head * head_size;  // C unless heads were pruned
  c_attn = register_module("c_attn", gpt2_linear(cfg.d_model, 3 * inner, kInitStd, init));
  c_proj = register_module("c_proj", gpt2_linear(inner, cfg.d_model, residual_std(cfg), init));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(cfg.dropout));
}

CausalSelfAttention::CausalSelfAttention(std::string type_name, int64_t n_head, int64_t head_size, double attn_dropout)
    : UnaryModule(std::move(type_name)), n_head(n_head), head_size(head_size), attn_dropout(attn_dropout) {}

void CausalSelfAttention::project_qkv(const Tensor& x, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t B = x.size(0), T = x.size(1), HS = head_size, inner = n_head * HS;
  Tensor qkv = c_attn->forward(x);  // (B, T, 3 NH HS)
  std::vector<Tensor> parts = split(qkv, inner, 2);  // 3 x (B, T, NH HS) views
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, n_head, HS}), 1, 2); };
  q = heads(parts[0]);  // (B, NH, T, HS)
  k = heads(parts[1]);
  v = heads(parts[2]);
}

Tensor CausalSelfAttention::merge_and_project(const Tensor& y) {
  const int64_t B = y.size(0), T = y.size(2), C = y.size(1) * y.size(3);  // C here: NH HS
  Tensor merged = reshape(transpose(y, 1, 2), {B, T, C});  // (B, T, NH, HS) -> (B, T, NH HS)
  return resid_dropout->forward(c_proj->forward(merged));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  auto scope = forward_scope();
  MG_CHECK(x.dim() == 3 && x.size(2) == c_attn->in_features, "CausalSelfAttention: expected input (B, T, ",
           c_attn->in_features, "), got ", x.shape());
  Tensor q, k, v;
  project_qkv(x, q, k, v);
  const double p = is_training() ? attn_dropout : 0.0;
  Tensor y;
  if (recompute_core) {  // selective checkpointing: the (B, NH, T, T) weights are not kept
    y = checkpoint(
        [p](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], /*causal=*/true, p)};
        },
        {q, k, v})[0];
  } else {
    y = scaled_dot_product_attention(q, k, v, /*causal=*/true, p);
  }
  return merge_and_project(y);  // (B, T, C)
}

// Note [KV cache]: the keys and values of positions already seen do not change when a token is
// appended (attention is causal and positions are absolute), so decoding keeps them in
// preallocated (1, NH, context, HS) tensors and computes only the new position's q, k, v. Each
// head's rows [pos, pos + T) are one contiguous block of the cache, so they are written with a
// plain copy_ per head (valid on any device).
Tensor CausalSelfAttention::forward_cached(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache,
                                           int64_t pos) {
  auto scope = forward_scope();
  MG_CHECK(c_attn != nullptr, type_name(), ": no KV-cache decoding on attention split over devices (--split tensor); "
           "sample from a single-device model");
  const int64_t T = x.size(1), context = k_cache.size(2), HS = k_cache.size(3);
  MG_CHECK(x.size(0) == 1 && pos >= 0 && pos + T <= context && (pos == 0 || T == 1),
           "CausalSelfAttention.forward_cached: expected a (1, T, C) prefill at pos 0 or one token after it, got ",
           x.shape(), " at pos ", pos, " with a cache of ", context, " positions");
  Tensor q, k, v;
  project_qkv(x, q, k, v);  // (1, NH, T, HS)
  Tensor kc = contiguous(k), vc = contiguous(v);
  for (int64_t head = 0; head < n_head; ++head) {
    copy_(narrow(select(k_cache, 1, head), 1, pos, T), select(kc, 1, head));  // (1, T, HS)
    copy_(narrow(select(v_cache, 1, head), 1, pos, T), select(vc, 1, head));
  }
  Tensor y;
  if (pos == 0) {
    y = scaled_dot_product_attention(q, k, v, /*causal=*/true);  // the prompt attends to itself
  } else {
    // One query at position pos sees every cached position 0..pos: no mask needed.
    Tensor keys = narrow(k_cache, 2, 0, pos + 1), values = narrow(v_cache, 2, 0, pos + 1);  // (1, NH, L, HS)
    Tensor scores = mul(matmul(q, transpose(keys, 2, 3)), 1.0 / std::sqrt(double(HS)));    // (1, NH, 1, L)
    y = matmul(softmax(scores, -1), values);                                                 // (1, NH, 1, HS)
  }
  return merge_and_project(y);
}

MLP::MLP(const GPTConfig& cfg, int64_t layer, const InitOptions& init) : UnaryModule("MLP") {
  const int64_t hidden = cfg.mlp_width(layer);  // 4C unless pruned
  c_fc = register_module("c_fc", gpt2_linear(cfg.d_model, hidden, kInitStd, init));
  c_proj = register_module("c_proj", gpt2_linear(hidden, cfg.d_model, residual_std(cfg), init));
  dropout = register_module("dropout", std::make_shared<Dropout>(cfg.dropout));
}

// GELU and c_proj run as one op (ops: gelu_linear) that keeps only c_fc's output for backward,
// not the GELU output too: one (B, T, 4C) tensor per block instead of two. A c_proj that is not a
// plain Linear (weight-only int8) runs as its own module.
Tensor MLP::forward(const Tensor& x) {
  auto scope = forward_scope();
  Tensor hidden = c_fc->forward(x);  // (B, T, 4C)
  if (c_proj->type_name() == "Linear") return dropout->forward(gelu_linear(hidden, c_proj->weight, c_proj->bias));
  return dropout->forward(c_proj->forward(gelu_tanh(hidden)));
}

Block::Block(const GPTConfig& cfg, int64_t layer, const InitOptions& init) : UnaryModule("Block") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.d_model, 1e-5, true, init));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(cfg, layer, init));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.d_model, 1e-5, true, init));
  mlp = register_module("mlp", std::make_shared<MLP>(cfg, layer, init));
}

// Note [Residual stream across devices]: the sublayers are called as (*m)(x), which moves x to
// the device a placed module runs on (parallel/placement.h); each sum then happens on its
// branch's device, so the residual stream follows the branches. On one device to() is a no-op.
Tensor Block::forward(const Tensor& x) {
  auto scope = forward_scope();
  Tensor a = (*attn)((*ln_1)(x));
  Tensor h = add(mg::to(x, a.device()), a);
  Tensor m = (*mlp)((*ln_2)(h));
  return add(mg::to(h, m.device()), m);
}

Tensor Block::forward_cached(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, int64_t pos) {
  auto scope = forward_scope();
  Tensor h = add(x, attn->forward_cached(ln_1->forward(x), k_cache, v_cache, pos));
  return add(h, mlp->forward(ln_2->forward(h)));
}

// ---- the model -------------------------------------------------------------------------------

GPT::GPT(GPTConfig cfg, InitOptions init) : Module("GPT"), cfg_(cfg) {
  cfg_.validate();
  const int64_t V = cfg_.vocab_size, Vp = cfg_.padded_vocab(), C = cfg_.d_model;
  wte = register_module("wte", std::make_shared<Embedding>(Vp, C, kInitStd, init));  // (Vp, C)
  wpe = register_module("wpe", std::make_shared<Embedding>(cfg_.context, C, kInitStd, init));  // (context, C)
  if (Vp > V) {
    NoGradGuard no_grad;
    fill_(narrow(wte->weight.detach(), 0, V, Vp - V), 0.0);  // padding rows: never looked up
  }
  drop = register_module("drop", std::make_shared<Dropout>(cfg_.dropout));
  h = register_module("h", std::make_shared<ModuleList>());
  for (int64_t l = 0; l < cfg_.n_layer; ++l) h->push_back(std::make_shared<Block>(cfg_, l, init));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(C, 1e-5, true, init));
}

Tensor GPT::embed(const Tensor& idx, int64_t pos0) {
  const int64_t T = idx.size(1);
  Tensor pos = arange(double(pos0), double(pos0 + T), 1.0, {.dtype = DType::i64, .device = idx.device()});  // (T)
  Tensor tok = (*wte)(idx);                    // (B, T, C)
  Tensor x = add(tok, mg::to((*wpe)(pos), tok.device()));  // + (T, C), on wte's device when split
  return drop->forward(x);
}

Tensor GPT::forward_hidden(const Tensor& idx) {
  auto scope = forward_scope();
  MG_CHECK(idx.defined() && idx.dim() == 2 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32),
           "GPT: expected token ids (B, T) of dtype i64 or i32, got ",
           idx.defined() ? shape_str(idx.shape()) : std::string("an undefined tensor"), " ",
           idx.defined() ? idx.dtype() : DType::i64);
  MG_CHECK(idx.size(1) >= 1 && idx.size(1) <= cfg_.context, "GPT: sequence length ", idx.size(1),
           " must be in [1, context = ", cfg_.context, "] (input ", idx.shape(), ")");
  MG_CHECK(idx.device() == wte->weight.device(), "GPT: token ids are on ", idx.device().str(),
           " but the model is on ", wte->weight.device().str(), " (move them with mg::to)");
  Tensor x = embed(idx, 0);
  // The blocks under the checkpoint policy (autograd/checkpoint.h: checkpoint_sequential),
  // called as (*block)(t), which moves t to a placed block's device (parallel/placement.h).
  std::vector<BlockFn> blocks;
  for (size_t l = 0; l < h->size(); ++l)
    blocks.push_back([block = h->at<Block>(l)](const Tensor& t) { return (*block)(t); });
  x = checkpoint_sequential(blocks, checkpoint_, x);  // (B, T, C)
  return (*ln_f)(x);                                   // (B, T, C)
}

// The output projection is tied to wte; only its first V rows are used, so the logits have the
// real vocabulary's width and the padding rows get no gradient from them.
static Tensor output_weight(const Embedding& wte, int64_t V) {
  return wte.num_embeddings == V ? wte.weight : narrow(wte.weight, 0, 0, V);  // (V, C)
}

Tensor GPT::logits(const Tensor& hidden) {
  // The head is wte: split over devices, the hidden states go back to wte's device.
  return linear(mg::to(hidden, wte->weight.device()), output_weight(*wte, cfg_.vocab_size));  // (B, T, V)
}

Tensor GPT::forward(const Tensor& idx) { return logits(forward_hidden(idx)); }

// The loss of the LM head: fused with it (ops: linear_cross_entropy, the (B, T, V) logits never
// whole) where that op runs, i.e. f32 / f64 off CUDA and not under autocast; else the plain
// head and cross_entropy (autocast's 16-bit logits, CUDA kernels). Both give the same loss.
Tensor GPT::loss_from_hidden(const Tensor& hidden, const Tensor& targets) {
  const int64_t BT = hidden.size(0) * hidden.size(1);
  MG_CHECK(targets.defined() && targets.numel() == BT, "GPT.loss: targets ",
           targets.defined() ? shape_str(targets.shape()) : std::string("(undefined)"), " do not match the hidden states ",
           hidden.shape());
  const Tensor w = output_weight(*wte, cfg_.vocab_size);  // (V, C)
  const Tensor hs = mg::to(hidden, w.device());
  const bool fused = (hs.dtype() == DType::f32 || hs.dtype() == DType::f64) && hs.dtype() == w.dtype() &&
                     !hs.device().is_cuda() && !autocast_wants_low({hs, w});
  if (fused) return linear_cross_entropy(reshape(hs, {BT, hs.size(2)}), w, reshape(targets, {BT}), kIgnoreIndex);
  Tensor lg = logits(hidden);  // (B, T, V)
  return cross_entropy(reshape(lg, {BT, cfg_.vocab_size}), reshape(targets, {BT}), kIgnoreIndex);
}

Tensor GPT::last_logits(const Tensor& hidden) {
  Tensor last = select(hidden, 1, hidden.size(1) - 1);                  // (1, C)
  return select(linear(last, output_weight(*wte, cfg_.vocab_size)), 0, 0);  // (V)
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  MG_CHECK(targets.defined() && targets.shape() == idx.shape(), "GPT.loss: targets ",
           targets.defined() ? shape_str(targets.shape()) : std::string("(undefined)"), " must have the shape of idx ",
           idx.shape());
  return loss_from_hidden(forward_hidden(idx), targets);
}

void GPT::set_checkpoint(CheckpointPolicy policy) {
  checkpoint_ = policy;
  for (size_t l = 0; l < h->size(); ++l) h->at<Block>(l)->attn->recompute_core = policy.kind == CheckpointPolicy::Kind::selective;
}

void for_each_block_linear(GPT& model,
                           const std::function<void(Module& parent, const char* name, std::shared_ptr<Linear>& member)>& f) {
  for (size_t i = 0; i < model.h->size(); ++i) {
    auto block = model.h->at<Block>(i);
    f(*block->attn, "c_attn", block->attn->c_attn);
    f(*block->attn, "c_proj", block->attn->c_proj);
    f(*block->mlp, "c_fc", block->mlp->c_fc);
    f(*block->mlp, "c_proj", block->mlp->c_proj);
  }
}

}  // namespace mg
