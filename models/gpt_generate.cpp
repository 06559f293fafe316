// GPT::generate: autoregressive sampling with temperature and top-k, using a KV cache (Note [KV
// cache] in gpt.cpp) so that each new token runs the network on one position instead of the whole
// prefix. The cache is one preallocated (1, NH, context, HS) key and value tensor per layer; once
// the sequence outgrows the context the model falls back to recomputing the last `context`
// tokens for every new token (positions are absolute, so a cropped window cannot reuse the cache).
#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "models/gpt.h"

namespace mg {
namespace {

// seq[begin, end) as a (1, end - begin) i64 tensor on `device`.
Tensor token_tensor(const std::vector<int64_t>& seq, size_t begin, size_t end, Device device) {
  std::vector<double> v(seq.begin() + std::ptrdiff_t(begin), seq.begin() + std::ptrdiff_t(end));
  return from_vector(v, {1, int64_t(end - begin)}, {.dtype = DType::i64, .device = device});
}

// Draws a token from logits (V) (any device and floating dtype). Greedy (argmax, first maximum)
// when temperature == 0 or top_k == 1; otherwise softmax(logits / temperature) restricted to the
// logits >= the k-th largest (ties at the threshold stay in, as in nanoGPT), sampled by inverting
// the cumulative sum in index order with u = uniform_at(step) of the seed's stream. top_p < 1 then
// keeps only the nucleus: the largest probabilities down to the one where their sum first reaches
// top_p (ties with it stay in), as Holtzman et al. (2020) and Hugging Face's TopPLogitsWarper. The f64 host
// copies are workspace tensors, so the allocator sees them.
int64_t sample_token(const Tensor& logits, const GenerateOptions& opt, int64_t step) {
  MemoryCategoryGuard guard(MemoryCategory::workspace);
  const int64_t V = logits.numel();
  Tensor host = logits.device().is_cpu() ? logits : mg::to(contiguous(logits), kCPU);
  Tensor p = empty({V}, {.dtype = DType::f64});  // (V) logits, then unnormalised probabilities
  copy_(p, host);
  double* l = p.data<double>();
  const int64_t best = std::max_element(l, l + V) - l;
  if (opt.temperature == 0.0 || opt.top_k == 1) return best;
  double threshold = -INFINITY;
  if (opt.top_k > 0 && opt.top_k < V) {
    Tensor scratch = clone(p);
    double* s = scratch.data<double>();
    std::nth_element(s, s + (opt.top_k - 1), s + V, std::greater<double>());
    threshold = s[opt.top_k - 1];  // the k-th largest logit
  }
  const double mx = l[best];
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    l[i] = l[i] >= threshold ? std::exp((l[i] - mx) / opt.temperature) : 0.0;
    total += l[i];
  }
  if (opt.top_p < 1.0) {
    Tensor scratch = clone(p);
    double* s = scratch.data<double>();
    std::sort(s, s + V, std::greater<double>());
    double cum = 0.0, cut = s[0];
    for (int64_t i = 0; i < V && s[i] > 0.0; ++i) {
      cum += s[i];
      cut = s[i];
      if (cum >= opt.top_p * total) break;
    }
    total = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      if (l[i] < cut) l[i] = 0.0;
      total += l[i];
    }
  }
  const double u = double(Generator(opt.seed).uniform_at(uint64_t(step))) * total;
  double cum = 0.0;
  int64_t last_nonzero = best;
  for (int64_t i = 0; i < V; ++i) {
    if (l[i] == 0.0) continue;
    cum += l[i];
    last_nonzero = i;
    if (cum > u) return i;
  }
  return last_nonzero;  // u rounded up to the total
}

}  // namespace

std::vector<int64_t> GPT::generate(const std::vector<int64_t>& prompt, int64_t max_new_tokens, GenerateOptions opt) {
  const char* op = "GPT.generate";
  MG_CHECK(!prompt.empty(), op, ": the prompt is empty (give at least one token)");
  MG_CHECK(max_new_tokens >= 0, op, ": max_new_tokens must be non-negative, got ", max_new_tokens);
  MG_CHECK(opt.temperature >= 0.0 && std::isfinite(opt.temperature), op,
           ": temperature must be finite and >= 0 (0 is greedy), got ", opt.temperature);
  MG_CHECK(opt.top_k >= 0, op, ": top_k must be >= 0 (0 keeps every token), got ", opt.top_k);
  MG_CHECK(opt.top_p > 0.0 && opt.top_p <= 1.0, op, ": top_p must be in (0, 1] (1 keeps every token), got ",
           opt.top_p);
  for (size_t i = 0; i < prompt.size(); ++i)
    MG_CHECK(prompt[i] >= 0 && prompt[i] < cfg_.vocab_size, op, ": prompt token ", prompt[i], " at position ", i,
             " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
  const Device device = wte->weight.device();
  MG_CHECK(!device.is_meta(), op, ": the model is on the meta device, which holds no values to sample from");
  for (const auto& [name, p] : named_parameters())
    MG_CHECK(p.device() == device, op, ": the model is split over devices (", name, " on ", p.device().str(), ", wte on ",
             device.str(), "); the KV cache needs one device: move the model with to(device) first");

  NoGradGuard no_grad;
  EvalGuard eval_mode(*this);  // no dropout while sampling
  std::vector<int64_t> seq = prompt;
  const int64_t HS = cfg_.head_size(), ctx = cfg_.context;

  // One (key, value) pair of (1, NH, context, HS) buffers per layer (NH: the layer's heads, fewer
  // when pruned), filled as tokens come.
  std::vector<Tensor> k_cache, v_cache;
  if (opt.use_kv_cache) {
    MemoryCategoryGuard guard(MemoryCategory::activation);
    for (int64_t l = 0; l < cfg_.n_layer; ++l) {
      const int64_t NH = cfg_.heads(l);
      k_cache.push_back(empty({1, NH, ctx, HS}, {.dtype = wte->weight.dtype(), .device = device}));
      v_cache.push_back(empty({1, NH, ctx, HS}, {.dtype = wte->weight.dtype(), .device = device}));
    }
  }
  size_t cached = 0;  // seq[0, cached) have their keys and values in the cache
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const size_t n = seq.size();
    Tensor logits;  // (V)
    if (!k_cache.empty() && int64_t(n) <= ctx) {
      // The prompt at the first step, one new token afterwards.
      Tensor x = embed(token_tensor(seq, cached, n, device), int64_t(cached));  // (1, T, C)
      for (size_t l = 0; l < h->size(); ++l)
        x = h->at<Block>(l)->forward_cached(x, k_cache[l], v_cache[l], int64_t(cached));
      logits = last_logits(ln_f->forward(x));
      cached = n;
    } else {
      // Past the context (or without a cache): the last `context` tokens, recomputed.
      k_cache.clear();  // the cache can no longer be used: give its memory back
      v_cache.clear();
      const size_t begin = n > size_t(ctx) ? n - size_t(ctx) : 0;
      logits = last_logits(forward_hidden(token_tensor(seq, begin, n, device)));
    }
    seq.push_back(sample_token(logits, opt, step));
  }
  return seq;
}

}  // namespace mg
