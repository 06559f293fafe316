# PyTorch's side of bench/compare_pytorch: the same fp32 training step as bench/compare_step.cpp
# (forward, backward, AdamW lr 3e-4 wd 0.01, dropout 0, random data) of gpt-mini, gpt-small,
# gpt2-124m (batch 1 x 1024) or mobilenetv2-32, written here in plain torch (no torchvision),
# printing one JSON line. --mode time:
# the median ms per step (default allocator); --mode memory: the resident-memory growth over one
# step after warm-up (the driver sets MALLOC_MMAP_THRESHOLD_=131072 for this pass, before torch loads).
# Usage: PYTHON compare_pytorch_torch.py MODEL [--mode time|memory] [--steps N] [--warmup N] [--threads N]
import argparse
import ctypes
import json
import math
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("model", choices=["gpt-mini", "gpt-small", "gpt2-124m", "mobilenetv2-32"])
ap.add_argument("--mode", choices=["time", "memory"], default="time")
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit(f"compare_pytorch: {sys.executable} cannot import torch (bench/compare_pytorch --setup installs it)")

torch.set_num_threads(args.threads)
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied embeddings
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def conv_bn_relu6(cin, cout, k, stride, groups):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, t):
        super().__init__()
        hidden = int(round(cin * t))
        self.use_res = stride == 1 and cin == cout
        layers = [conv_bn_relu6(cin, hidden, 1, 1, 1)] if t != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0), small-input variant as models/mobilenet_v2.cpp:
    stem stride 1 and the first stride-2 stage at stride 1 for 32x32 images."""

    def __init__(self, num_classes=10):
        super().__init__()
        table = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                 (6, 320, 1, 1)]
        c = 32
        feats = [conv_bn_relu6(3, c, 3, 1, 1)]
        first = True
        for t, out, n, s in table:
            if s == 2 and first:
                first, s = False, 1
            for i in range(n):
                feats.append(InvertedResidual(c, out, s if i == 0 else 1, t))
                c = out
        feats.append(conv_bn_relu6(c, 1280, 1, 1, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x, y):
        f = self.features(x).mean(dim=(2, 3))
        return F.cross_entropy(self.classifier(f), y)


if args.model.startswith("gpt"):
    V, T, L, H, C = {"gpt-mini": (256, 128, 4, 4, 256), "gpt-small": (256, 256, 8, 8, 512),
                     "gpt2-124m": (50257, 1024, 12, 12, 768)}[args.model]
    B = 1 if args.model == "gpt2-124m" else 8
    model = GPT(V, T, L, H, C)
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
else:
    model = MobileNetV2(10)
    x = torch.randn(64, 3, 32, 32)
    y = torch.randint(0, 10, (64,))
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)


def step():
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    opt.step()
    return loss.item()


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(key + " not in /proc/self/status")


for _ in range(args.warmup):
    step()

def blas_info():
    # PyPI wheels report BLAS_INFO=mkl; Debian's reports generic and calls libblas.so.3, which the
    # alternatives system points at OpenBLAS only when libopenblas0-openmp is installed.
    cfg = torch.__config__.show()
    info = next((l.split("BLAS_INFO=", 1)[1].strip() for l in cfg.replace(",", "\n").splitlines()
                 if "BLAS_INFO=" in l), "?")
    if info == "generic":
        with open("/proc/self/maps") as f:
            for line in f:
                if "libblas" in line or "openblas" in line:
                    info = "generic -> " + line.split()[-1]
                    break
    return info + (", oneDNN" if torch.backends.mkldnn.is_available() else "")


growth = None
ms = []
loss = 0.0
if args.mode == "memory":
    # Resident-memory growth over one step: freed tensors leave the resident set (mmap threshold
    # set by the driver, malloc_trim here); VmHWM is reset to the current RSS by clear_refs 5.
    libc = ctypes.CDLL("libc.so.6")
    opt.zero_grad(set_to_none=True)
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss_before = status_kib("VmRSS")
    loss = step()
    growth = (status_kib("VmHWM") - rss_before) * 1024
    ms = [0.0]
else:
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        ms.append((time.perf_counter() - t0) * 1e3)
s = sorted(ms)
median = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
print(json.dumps({"model": args.model, "impl": "torch", "torch": torch.__version__, "python": sys.executable,
                  "blas": blas_info(), "threads": torch.get_num_threads(), "mode": args.mode,
                  "ms_median": round(median, 3), "step_growth_bytes": growth,
                  "loss": loss, "ms": [round(v, 3) for v in ms]}))
