#!/usr/bin/python3
"""Reference values from PyTorch for memgrad's model tests (GPT and MobileNetV2).

Writes, with memgrad's parameter names (the same as Hugging Face GPT-2 / torchvision):
  tests/fixtures/gpt_tiny.safetensors       a tiny GPT in f64: its weights, then fixture.idx,
      fixture.targets (one -100 = ignored), fixture.logits (B, T, V), fixture.loss and
      fixture.grad.<param> for every parameter.
  tests/fixtures/mobilenet_tiny.safetensors MobileNetV2 width 0.25, 10 classes: weights and BN
      buffers stored in f32 (computed in f64 from those values), then two cases fixture.<case>.*
      ("small": small_input on 16x16, "std": the ImageNet layout on 32x32): input x, targets,
      eval_logits (eval mode, running statistics), logits and loss (train mode, batch statistics),
      a few gradients grad.<param> and the BN buffers after the training forward.
tests/models/test_gpt.cpp and test_mobilenet.cpp load the weights, run memgrad on the inputs and
compare. Run by hand when the cases change (the suite itself needs no Python):
    OMP_NUM_THREADS=2 /usr/bin/python3 tests/gen_model_fixtures.py
torch 1.13 (Debian's python3-torch): attention is written by hand, safetensors too, and the
MobileNetV2 below mirrors torchvision/models/mobilenetv2.py (torchvision is not installed).
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors_writer import write_safetensors  # tests/safetensors_writer.py

torch.manual_seed(20261207)
torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))


def rnd(*shape, lo=-1.0, hi=1.0):
    return torch.rand(tuple(shape)) * (hi - lo) + lo


# ---- GPT (memgrad layout: Linear weights (out, in), wte padded to a multiple of 128) ----------
V, VP, CTX, NL, NH, C = 50, 128, 16, 2, 2, 16
B, T = 2, 8


def gpt_params():
    p = {"wte.weight": rnd(VP, C, lo=-0.5, hi=0.5), "wpe.weight": rnd(CTX, C, lo=-0.5, hi=0.5)}
    for l in range(NL):
        pre = f"h.{l}."
        for ln in ("ln_1", "ln_2"):
            p[pre + ln + ".weight"] = rnd(C, lo=0.5, hi=1.5)
            p[pre + ln + ".bias"] = rnd(C, lo=-0.2, hi=0.2)
        for name, (o, i) in {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C),
                             "mlp.c_proj": (C, 4 * C)}.items():
            p[pre + name + ".weight"] = rnd(o, i, lo=-1, hi=1) / math.sqrt(i)
            p[pre + name + ".bias"] = rnd(o, lo=-0.1, hi=0.1)
    p["ln_f.weight"] = rnd(C, lo=0.5, hi=1.5)
    p["ln_f.bias"] = rnd(C, lo=-0.2, hi=0.2)
    return p


def gpt_forward(p, idx):
    """GPT-2: pre-LN blocks, causal attention, GELU(tanh) MLP, logits from wte's first V rows."""
    t = idx.shape[1]
    x = p["wte.weight"][idx] + p["wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for l in range(NL):
        g = lambda n: p[f"h.{l}.{n}"]
        a = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), 1e-5)
        q, k, v = F.linear(a, g("attn.c_attn.weight"), g("attn.c_attn.bias")).split(C, dim=2)
        heads = lambda z: z.view(z.shape[0], t, NH, C // NH).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        y = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        y = y.transpose(1, 2).reshape(x.shape[0], t, C)
        x = x + F.linear(y, g("attn.c_proj.weight"), g("attn.c_proj.bias"))
        m = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), 1e-5)
        m = F.gelu(F.linear(m, g("mlp.c_fc.weight"), g("mlp.c_fc.bias")), approximate="tanh")
        x = x + F.linear(m, g("mlp.c_proj.weight"), g("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return F.linear(x, p["wte.weight"][:V])


def gpt_fixture():
    p = {k: v.requires_grad_() for k, v in gpt_params().items()}
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[1, 3] = -100
    logits = gpt_forward(p, idx)
    loss = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T), ignore_index=-100)
    loss.backward()
    out = dict(p)
    out.update({"fixture.idx": idx, "fixture.targets": targets, "fixture.logits": logits, "fixture.loss": loss})
    out.update({f"fixture.grad.{k}": v.grad for k, v in p.items()})
    write_safetensors(os.path.join(HERE, "fixtures", "gpt_tiny.safetensors"), out, "tests/gen_model_fixtures.py")


# ---- MobileNetV2 (torchvision's structure and names) ------------------------------------------
def make_divisible(v, divisor=8):
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def conv_bn(inp, oup, k, stride, groups=1):
    return nn.Sequential(nn.Conv2d(inp, oup, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(oup), nn.ReLU6())


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, t):
        super().__init__()
        hidden = int(round(inp * t))
        self.use_res = stride == 1 and inp == oup
        layers = [conv_bn(inp, hidden, 1, 1)] if t != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
                   nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, width=1.0, classes=1000, small_input=False, dropout=0.2):
        super().__init__()
        c = make_divisible(32 * width)
        last = make_divisible(1280 * max(1.0, width))
        feats, first = [conv_bn(3, c, 3, 1 if small_input else 2)], True
        for t, ch, n, s in [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
                            [6, 160, 3, 2], [6, 320, 1, 1]]:
            if s == 2 and first:
                first, s = False, (1 if small_input else 2)
            out = make_divisible(ch * width)
            for i in range(n):
                feats.append(InvertedResidual(c, out, s if i == 0 else 1, t))
                c = out
        feats.append(conv_bn(c, last, 1, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def count(m):
    return sum(p.numel() for p in m.parameters())


GRADS = ["features.0.0.weight", "features.1.conv.0.0.weight", "features.2.conv.0.1.weight",
         "features.2.conv.3.bias", "features.17.conv.2.weight", "features.18.1.weight", "classifier.1.weight",
         "classifier.1.bias"]
BUFFERS = ["features.0.1", "features.9.conv.1.1", "features.18.1"]


def mobilenet_fixture():
    print("MobileNetV2 parameters: width 1.0 / 1000 classes", count(MobileNetV2()),
          "| 10 classes", count(MobileNetV2(classes=10, small_input=True)))
    state = {}
    ref = MobileNetV2(0.25, 10, dropout=0.0)
    for name, t in ref.state_dict().items():  # random values everywhere, rounded to f32
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(3, dtype=torch.int64)
        elif name.endswith("running_var") or (name.endswith(".weight") and t.dim() == 1):
            state[name] = rnd(*t.shape, lo=0.5, hi=1.5).float()
        elif name.endswith("running_mean") or name.endswith(".bias"):
            state[name] = rnd(*t.shape, lo=-0.3, hi=0.3).float()
        else:
            fan_in = t[0].numel()
            state[name] = (rnd(*t.shape) * math.sqrt(3.0 / fan_in)).float()
    out = dict(state)
    for case, small, hw in [("small", True, 16), ("std", False, 32)]:
        m = MobileNetV2(0.25, 10, small_input=small, dropout=0.0)
        m.load_state_dict({k: (v.double() if v.is_floating_point() else v) for k, v in state.items()})
        x, targets = rnd(2, 3, hw, hw), torch.tensor([3, 7])
        m.eval()
        eval_logits = m(x).detach()
        m.train()
        logits = m(x)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        params, sd = dict(m.named_parameters()), m.state_dict()
        pre = f"fixture.{case}."
        out.update({pre + "x": x, pre + "targets": targets, pre + "eval_logits": eval_logits, pre + "logits": logits,
                    pre + "loss": loss})
        out.update({pre + "grad." + g: params[g].grad for g in GRADS})
        for b in BUFFERS:
            for k in ("running_mean", "running_var", "num_batches_tracked"):
                out[f"{pre}{b}.{k}"] = sd[f"{b}.{k}"]
    write_safetensors(os.path.join(HERE, "fixtures", "mobilenet_tiny.safetensors"), out, "tests/gen_model_fixtures.py")


gpt_fixture()
mobilenet_fixture()
