#!/usr/bin/python3
"""A tiny Hugging Face-style GPT-2 checkpoint for testing GPT::load_hf_gpt2.

Writes tests/fixtures/gpt2_hf_tiny.safetensors in the naming and layout of transformers'
GPT2LMHeadModel: "transformer.wte.weight" (V, C) unpadded, "transformer.h.N.attn.c_attn.weight"
as Conv1D (in, out), the causal-mask buffers "h.N.attn.bias" / "h.N.attn.masked_bias" that
older checkpoints carry, f32 like the published files. And tests/fixtures/gpt2_hf_tiny_expected
.safetensors: token ids "idx" and the logits of GPT-2's forward, written here in HF's own layout
(x @ W + b for Conv1D), computed in f64 from the f32 weights. tests/models/test_gpt.cpp loads the
checkpoint (with and without the "transformer." prefix) and compares. Run by hand:
    OMP_NUM_THREADS=2 /usr/bin/python3 tests/gen_gpt2_fixture.py
"""
import math
import os

import torch
import torch.nn.functional as F

from safetensors_writer import write_safetensors  # tests/safetensors_writer.py

torch.manual_seed(20261208)
HERE = os.path.dirname(os.path.abspath(__file__))
V, CTX, NL, NH, C = 100, 32, 2, 2, 32  # vocab 100 is padded to 128 rows in memgrad
B, T = 2, 12


def rnd(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(tuple(shape), dtype=torch.float64) * (hi - lo) + lo).float()


hf = {"transformer.wte.weight": rnd(V, C, lo=-0.5, hi=0.5), "transformer.wpe.weight": rnd(CTX, C, lo=-0.5, hi=0.5)}
for l in range(NL):
    pre = f"transformer.h.{l}."
    hf[pre + "ln_1.weight"], hf[pre + "ln_1.bias"] = rnd(C, lo=0.5, hi=1.5), rnd(C, lo=-0.2, hi=0.2)
    hf[pre + "attn.bias"] = torch.ones(CTX, CTX).tril().view(1, 1, CTX, CTX)
    hf[pre + "attn.masked_bias"] = torch.tensor(-1e4)
    for name, (i, o) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
                         "mlp.c_proj": (4 * C, C)}.items():
        hf[pre + name + ".weight"] = rnd(i, o) / math.sqrt(i)  # Conv1D: (in, out)
        hf[pre + name + ".bias"] = rnd(o, lo=-0.1, hi=0.1)
    hf[pre + "ln_2.weight"], hf[pre + "ln_2.bias"] = rnd(C, lo=0.5, hi=1.5), rnd(C, lo=-0.2, hi=0.2)
hf["transformer.ln_f.weight"], hf["transformer.ln_f.bias"] = rnd(C, lo=0.5, hi=1.5), rnd(C, lo=-0.2, hi=0.2)


def gpt2_forward(w, idx):
    """transformers' GPT2LMHeadModel forward (eval, no dropout) in f64, Conv1D as x @ W + b."""
    g = lambda n: w["transformer." + n].double()
    conv1d = lambda x, n: x @ g(n + ".weight") + g(n + ".bias")
    t = idx.shape[1]
    x = g("wte.weight")[idx] + g("wpe.weight")[:t]
    for l in range(NL):
        pre = f"h.{l}."
        a = F.layer_norm(x, (C,), g(pre + "ln_1.weight"), g(pre + "ln_1.bias"), 1e-5)
        q, k, v = conv1d(a, pre + "attn.c_attn").split(C, dim=2)
        heads = lambda z: z.view(B, t, NH, C // NH).permute(0, 2, 1, 3)
        q, k, v = heads(q), heads(k), heads(v)
        att = q @ k.transpose(-1, -2) / math.sqrt(C // NH)
        causal = g(pre + "attn.bias")[:, :, :t, :t].bool()
        att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
        y = (torch.softmax(att, dim=-1) @ v).permute(0, 2, 1, 3).reshape(B, t, C)
        x = x + conv1d(y, pre + "attn.c_proj")
        m = F.layer_norm(x, (C,), g(pre + "ln_2.weight"), g(pre + "ln_2.bias"), 1e-5)
        x = x + conv1d(F.gelu(conv1d(m, pre + "mlp.c_fc"), approximate="tanh"), pre + "mlp.c_proj")
    x = F.layer_norm(x, (C,), g("ln_f.weight"), g("ln_f.bias"), 1e-5)
    return x @ g("wte.weight").T  # lm_head tied to wte


GENERATOR = "tests/gen_gpt2_fixture.py"
idx = torch.randint(0, V, (B, T))
write_safetensors(os.path.join(HERE, "fixtures", "gpt2_hf_tiny.safetensors"), hf, GENERATOR, {"format": "pt"})
write_safetensors(os.path.join(HERE, "fixtures", "gpt2_hf_tiny_expected.safetensors"),
                  {"idx": idx, "logits": gpt2_forward(hf, idx)}, GENERATOR, {"format": "pt"})
