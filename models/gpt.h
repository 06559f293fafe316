// GPT: the GPT-2 architecture (Radford et al. 2019; llm.c's train_gpt2.c is the reference):
// token + learned position embeddings, n_layer pre-LayerNorm blocks (causal self-attention, GELU
// tanh MLP of width 4C), a final LayerNorm and an output projection tied to the token embedding.
// Module names mirror Hugging Face's GPT-2 (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...), so
// load_hf_gpt2 reads a Hugging Face model.safetensors. Sampling (generate) keeps a KV cache.
// Shapes: B batch, T time, C d_model, NH heads, HS head size (C / NH), V vocab, Vp padded vocab.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "models/nn/nn.h"

namespace mg {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t context = 128;  // longest sequence (rows of wpe)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 256;
  double dropout = 0.0;  // on embeddings, attention weights and both residual branches
  // Per-layer widths left by structured pruning (models/compress/); empty: the architecture's.
  // mlp_hidden[l]: block l's MLP width (4C unless pruned); layer_heads[l]: its attention heads
  // (n_head unless pruned; the head size stays d_model / n_head).
  std::vector<int64_t> mlp_hidden{};
  std::vector<int64_t> layer_heads{};

  // The rows of wte: vocab_size rounded up to a multiple of 128 (50257 -> 50304, as in llm.c),
  // so the embedding table has GEMM-friendly sizes. The extra rows start at zero and no token
  // ever selects them; the logits are computed for the real vocab only.
  int64_t padded_vocab() const;
  // "gpt-mini", "gpt-small", "gpt2-124m" (docs/DESIGN.md workloads); throws listing the names.
  static GPTConfig named(const std::string& name);
  static std::vector<std::string> names();
  nlohmann::json to_json() const;
  // Missing keys keep their defaults; an unknown key or an invalid value is an error.
  static GPTConfig from_json(const nlohmann::json& j);
  // Throws naming the bad field (d_model not divisible by n_head, non-positive sizes, ...).
  void validate() const;
  int64_t head_size() const { return d_model / n_head; }
  int64_t mlp_width(int64_t layer) const;  // mlp_hidden[layer], or 4 d_model
  int64_t heads(int64_t layer) const;      // layer_heads[layer], or n_head
};

struct GenerateOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // sample among the k largest logits; 0: all; 1: greedy
  double top_p = 1.0;        // nucleus: the most likely tokens whose probability sums to >= top_p; 1: all
  uint64_t seed = 0;         // the sampling stream: token i uses uniform_at(i) of Generator(seed)
  bool use_kv_cache = true;  // false: recompute the whole window for every token (reference)
};

// x: (B, T, C) -> (B, T, C). qkv = c_attn(x) (B, T, 3 NH HS) split into heads, causal attention,
// c_proj back to C (NH HS = C unless heads were pruned). c_attn / c_proj are Linear (weight (out, in)); HF's Conv1D (in, out) is
// transposed on load.
class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(const GPTConfig& cfg, int64_t layer, const InitOptions& init);
  Tensor forward(const Tensor& x) override;
  // One decoding step with the KV cache: x (1, T, C) are positions [pos, pos + T); their keys
  // and values are written into k_cache / v_cache (1, NH, context, HS) and the queries attend
  // to every cached position < pos + T. pos == 0 is the prefill of the prompt.
  Tensor forward_cached(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, int64_t pos);
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;
  int64_t n_head;     // this layer's heads
  int64_t head_size;  // HS
  double attn_dropout;
  bool recompute_core = false;  // selective checkpointing of scores, softmax and dropout

 protected:
  // For subclasses that hold the projections in another form (parallel/tensor_parallel.h: shards
  // on several devices): sizes only; c_attn, c_proj and resid_dropout are left to the subclass.
  CausalSelfAttention(std::string type_name, int64_t n_head, int64_t head_size, double attn_dropout);

 private:
  // x (B, T, C) -> q, k, v each (B, NH, T, HS) (views of one (B, T, 3C) tensor).
  void project_qkv(const Tensor& x, Tensor& q, Tensor& k, Tensor& v);
  // y (B, NH, T, HS) -> c_proj(merged heads) (B, T, C), then residual dropout.
  Tensor merge_and_project(const Tensor& y);
};

// x: (B, T, C) -> (B, T, C): c_fc (C -> 4C), GELU(tanh), c_proj (4C -> C), dropout (4C is the
// layer's mlp_width when pruned).
class MLP : public UnaryModule {
 public:
  MLP(const GPTConfig& cfg, int64_t layer, const InitOptions& init);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> dropout;

 protected:
  // For subclasses that hold the projections in another form (parallel/tensor_parallel.h):
  // nothing registered; c_fc, c_proj and dropout are left to the subclass.
  explicit MLP(std::string type_name) : UnaryModule(std::move(type_name)) {}
};

// x: (B, T, C) -> (B, T, C): x + attn(ln_1(x)), then + mlp(ln_2(.)).
class Block : public UnaryModule {
 public:
  Block(const GPTConfig& cfg, int64_t layer, const InitOptions& init);
  Tensor forward(const Tensor& x) override;
  Tensor forward_cached(const Tensor& x, const Tensor& k_cache, const Tensor& v_cache, int64_t pos);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

class GPT : public Module {
 public:
  // Initialised as GPT-2: every Linear weight and both embeddings ~ N(0, 0.02^2), the two
  // c_proj weights of each block ~ N(0, (0.02 / sqrt(2 n_layer))^2), biases 0, LayerNorms 1 / 0,
  // the padding rows of wte 0. Any device, kMeta included (shapes and bytes only).
  explicit GPT(GPTConfig cfg, InitOptions init = {});

  // idx: (B, T) i64/i32 token ids, T <= context -> logits (B, T, V) for the real vocab (the
  // padding rows of wte are not projected onto, so no probability mass goes to them).
  Tensor forward(const Tensor& idx);
  // Targets with this value (padding) are left out of the loss and its mean.
  static constexpr int64_t kIgnoreIndex = -100;
  // idx, targets: (B, T) -> scalar mean cross-entropy over targets != kIgnoreIndex.
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // The hidden states before the output projection: (B, T) -> ln_f output (B, T, C).
  Tensor forward_hidden(const Tensor& idx);
  // The pieces of forward, for a pipeline that runs them stage by stage (parallel/pipeline.h):
  // embeddings + dropout (B, T) -> (B, T, C) at positions pos0...; the tied output projection
  // hidden (B, T, C) -> logits (B, T, V), computed on wte's device (the head is wte); and the
  // mean cross-entropy of logits(hidden) against targets (B, T) (on wte's device too).
  Tensor embed(const Tensor& idx, int64_t pos0);
  Tensor logits(const Tensor& hidden);
  Tensor loss_from_hidden(const Tensor& hidden, const Tensor& targets);
  // prompt followed by max_new_tokens sampled tokens (the prompt included in the result). With
  // the KV cache each new token costs one position's forward; once the sequence outgrows the
  // context the learned positions shift, so the cache cannot be reused and every further token
  // recomputes the last `context` tokens (nanoGPT's cropping). Runs under no_grad, in eval mode
  // semantics for dropout (the model's train flag is restored afterwards).
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                GenerateOptions opt = {});
  // Reads a Hugging Face GPT-2 model.safetensors (names with or without "transformer."; Conv1D
  // weights (in, out) transposed into Linear's (out, in); wte's V rows padded to Vp with zeros;
  // attn.bias / attn.masked_bias masks and a tied lm_head.weight ignored). The file's shapes must
  // match this model's config; every parameter must be present. Throws naming file and key.
  void load_hf_gpt2(const std::string& path);
  // The same from tensors already in memory (HF names and layouts), e.g. read on kMeta.
  void load_hf_gpt2(const NamedTensors& hf, const std::string& source = "state dict");

  const GPTConfig& config() const { return cfg_; }
  // Activation checkpointing of the blocks (autograd/checkpoint.h); none by default. Gradients
  // are bit-identical under every policy; only memory and time change.
  void set_checkpoint(CheckpointPolicy policy);
  const CheckpointPolicy& checkpoint_policy() const { return checkpoint_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  // Logits of the last position only: (1, T) -> (V) (what sampling needs).
  Tensor last_logits(const Tensor& hidden);
  GPTConfig cfg_;
  CheckpointPolicy checkpoint_;
};

// Calls f(parent, name, member) for the four Linears of every block (attn.c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj), in order: what the compression passes replace by int8 or sparse layers
// (assign the new layer to member and call parent.replace_child(name, member)).
void for_each_block_linear(GPT& model,
                           const std::function<void(Module& parent, const char* name, std::shared_ptr<Linear>& member)>& f);

}  // namespace mg
