// Reading Hugging Face GPT-2 weights (model.safetensors) into a GPT. The names are memgrad's
// with an optional "transformer." prefix; HF's Conv1D stores its weight as (in, out), so c_attn,
// c_proj and c_fc weights are transposed into Linear's (out, in); wte's V rows go into the first V
// rows of our (Vp, C) table and the padding rows are zeroed. Everything is checked before
// anything is written, and every problem is listed in one error naming the file.
#include <map>
#include <set>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"
#include "models/gpt.h"

namespace mg {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's Conv1D layers: weight (in, out).
bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// Entries of an HF checkpoint that are not parameters of ours: the causal-mask buffers of older
// transformers versions and the output head, which GPT-2 ties to wte.
bool is_ignored(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") || name == "lm_head.weight";
}

// dst = src, converting dtype and layout on src's device first (copy_ across devices needs
// contiguous tensors of one dtype).
void assign(const Tensor& dst, Tensor src) {
  if (src.dtype() != dst.dtype()) src = cast(src, dst.dtype());
  if (src.device() != dst.device()) src = contiguous(src);
  copy_(dst, src);
}

}  // namespace

void GPT::load_hf_gpt2(const std::string& path) {
  MemoryCategoryGuard guard(MemoryCategory::other);  // the file's tensors: temporary host copies
  load_hf_gpt2(load_safetensors(path, kCPU), path);
}

void GPT::load_hf_gpt2(const NamedTensors& hf, const std::string& source) {
  const std::string op = "GPT.load_hf_gpt2(" + source + ")";
  // HF name (prefix stripped) -> tensor.
  std::map<std::string, Tensor> file;
  for (const auto& [raw, t] : hf) {
    std::string name = raw.rfind("transformer.", 0) == 0 ? raw.substr(12) : raw;
    MG_CHECK(file.emplace(name, t).second, op, ": the tensor '", name, "' appears twice (with and without the ",
             "\"transformer.\" prefix)");
  }
  const int64_t V = cfg_.vocab_size;
  std::vector<std::string> problems;
  std::set<std::string> used;
  NamedTensors mine = state_dict();
  for (const auto& [name, dst] : mine) {
    auto it = file.find(name);
    if (it == file.end()) {
      problems.push_back("missing '" + name + "' (model has " + shape_str(dst.shape()) + ")");
      continue;
    }
    used.insert(name);
    const Tensor& src = it->second;
    Shape expect = dst.shape();
    if (is_conv1d_weight(name)) expect = {dst.size(1), dst.size(0)};  // (in, out)
    if (name == "wte.weight") expect[0] = V;                            // unpadded rows
    if (src.shape() != expect || !is_floating(src.dtype()))
      problems.push_back("'" + name + "': the file has " + shape_str(src.shape()) + " " +
                         std::string(dtype_name(src.dtype())) + ", expected " + shape_str(expect) +
                         " floating for config " + cfg_.to_json().dump());
  }
  for (const auto& [name, _] : file)
    if (!used.count(name) && !is_ignored(name)) problems.push_back("unexpected tensor '" + name + "'");
  if (!problems.empty()) {
    std::string msg = op + ": " + std::to_string(problems.size()) + " problem(s):";
    for (const auto& p : problems) msg += "\n  " + p;
    MG_THROW(msg, "\n  hint: the model's GPTConfig must match the checkpoint (gpt2-124m for HF's \"gpt2\")");
  }
  // Everything checked: write into the parameters' existing storage (casts and transposed copies
  // are temporaries, tagged other).
  NoGradGuard no_grad;
  MemoryCategoryGuard guard(MemoryCategory::other);
  for (const auto& [name, dst] : mine) {
    const Tensor& src = file.at(name);
    if (is_conv1d_weight(name)) {
      assign(dst, transpose(src, 0, 1));
    } else if (name == "wte.weight") {
      assign(narrow(dst, 0, 0, V), src);
      if (dst.size(0) > V) fill_(narrow(dst, 0, V, dst.size(0) - V), 0.0);
    } else {
      assign(dst, src);
    }
  }
}

}  // namespace mg
