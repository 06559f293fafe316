#!/usr/bin/python3
"""Reference values from PyTorch for memgrad's op tests.

Writes tests/fixtures/ops.safetensors: for every case NAME, its inputs NAME.in0, NAME.in1, ...,
the output NAME.out, the gradient given to backward NAME.gout and the input gradients
NAME.grad0, NAME.grad1, ... (f64, computed on the CPU). tests/ops/test_fixtures.cpp runs the
same op in memgrad on the same inputs and compares. Run by hand when cases change:
    OMP_NUM_THREADS=2 /usr/bin/python3 tests/gen_fixtures.py
(Debian's python3-torch). The test suite itself needs no Python.
"""
import math
import os

import torch
import torch.nn.functional as F

from safetensors_writer import write_safetensors  # tests/safetensors_writer.py

torch.manual_seed(20261202)
torch.set_default_dtype(torch.float64)
cases = {}


def rnd(*shape, lo=-1.0, hi=1.0):
    return torch.rand(tuple(shape)) * (hi - lo) + lo


def case(name, fn, inputs, differentiable=None):
    """Runs fn(*inputs) in f64, backward with a random gradient, and stores everything."""
    differentiable = differentiable if differentiable is not None else [x.is_floating_point() for x in inputs]
    ins = [x.clone().requires_grad_(d) for x, d in zip(inputs, differentiable)]
    out = fn(*ins)
    entry = {f"in{i}": x.detach() for i, x in enumerate(ins)}
    entry["out"] = out.detach()
    if any(differentiable):
        gout = rnd(*out.shape)
        out.backward(gout)
        entry["gout"] = gout
        for i, x in enumerate(ins):
            if differentiable[i]:
                entry[f"grad{i}"] = x.grad
    cases[name] = entry


gelu = lambda x: F.gelu(x, approximate="tanh")
case("add_broadcast", torch.add, [rnd(2, 3, 4), rnd(3, 1)])
case("sub_broadcast", torch.sub, [rnd(4), rnd(3, 4)])
case("mul_broadcast", torch.mul, [rnd(2, 1, 4), rnd(3, 4)])
case("div", torch.div, [rnd(3, 4), rnd(3, 4, lo=0.5, hi=2)])
case("pow", torch.pow, [rnd(3, 4, lo=0.5, hi=2), rnd(3, 4)])
case("maximum", torch.maximum, [rnd(3, 4), rnd(4)])
for name, f, lo in [("exp", torch.exp, -1), ("log", torch.log, 0.2), ("tanh", torch.tanh, -2),
                    ("sigmoid", torch.sigmoid, -3), ("relu", torch.relu, -1), ("gelu_tanh", gelu, -3),
                    ("silu", F.silu, -3), ("relu6", F.relu6, -8), ("sqrt", torch.sqrt, 0.2),
                    ("rsqrt", torch.rsqrt, 0.2), ("abs", torch.abs, -1)]:
    case(name, f, [rnd(5, 7, lo=lo, hi=8 if name == "relu6" else 2)])
case("sum_dims", lambda x: x.sum(dim=(0, 2)), [rnd(3, 4, 5)])
case("mean_keepdim", lambda x: x.mean(dim=1, keepdim=True), [rnd(3, 4, 5)])
case("var", lambda x: x.var(dim=2), [rnd(3, 4, 5)])
case("amax", lambda x: x.amax(dim=1), [rnd(3, 4, 5)])
case("matmul_2d", torch.matmul, [rnd(5, 6), rnd(6, 7)])
case("matmul_batched_broadcast", torch.matmul, [rnd(2, 1, 3, 4), rnd(3, 4, 5)])
case("linear", F.linear, [rnd(2, 3, 6), rnd(5, 6), rnd(5)])
case("softmax", lambda x: torch.softmax(x, dim=-1), [rnd(4, 9, lo=-4, hi=4)])
case("log_softmax_dim0", lambda x: torch.log_softmax(x, dim=0), [rnd(6, 5, lo=-4, hi=4)])
target = torch.tensor([3, 0, 9, -100, 5, 1])
case("cross_entropy", lambda x, t: F.cross_entropy(x, t, ignore_index=-100), [rnd(6, 10, lo=-3, hi=3), target])
case("mse_loss", F.mse_loss, [rnd(4, 5), rnd(4, 5)])
case("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), [rnd(3, 4, 8), rnd(8), rnd(8)])
rm, rv = rnd(3), rnd(3, lo=0.5, hi=2)
rm_after, rv_after = rm.clone(), rv.clone()
case("batch_norm_train", lambda x, w, b: F.batch_norm(x, rm_after, rv_after, w, b, True, 0.1, 1e-5),
     [rnd(4, 3, 5, 5), rnd(3), rnd(3)])
cases["batch_norm_train"].update({"running_mean": rm, "running_var": rv,
                                  "running_mean_after": rm_after, "running_var_after": rv_after})
case("batch_norm_eval", lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5),
     [rnd(4, 3, 5, 5), rnd(3), rnd(3)])
cases["batch_norm_eval"].update({"running_mean": rm, "running_var": rv})
case("conv2d_s2_p1_g2", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
     [rnd(2, 4, 7, 7), rnd(6, 2, 3, 3), rnd(6)])
case("conv2d_depthwise", lambda x, w: F.conv2d(x, w, None, stride=1, padding=1, groups=6),
     [rnd(2, 6, 6, 6), rnd(6, 1, 3, 3)])
case("conv2d_1x1", lambda x, w: F.conv2d(x, w), [rnd(2, 5, 4, 4), rnd(7, 5, 1, 1)])
case("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1), [rnd(2, 3, 7, 7)])
case("avg_pool2d", lambda x: F.avg_pool2d(x, 2, 2, 0), [rnd(2, 3, 6, 6)])
case("global_avg_pool2d", lambda x: x.mean(dim=(2, 3)), [rnd(2, 3, 5, 5)])
case("embedding", F.embedding, [torch.tensor([[1, 4, 4], [0, 2, 1]]), rnd(6, 5)], [False, True])
def causal_attention(q, k, v):  # torch 1.13 has no F.scaled_dot_product_attention
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


case("attention_causal", causal_attention,
     [rnd(2, 3, 5, 4), rnd(2, 3, 5, 4), rnd(2, 3, 5, 4)])
case("cat_dim1", lambda a, b: torch.cat([a, b], dim=1), [rnd(2, 3, 4), rnd(2, 5, 4)])
case("stack_dim0", lambda a, b: torch.stack([a, b], dim=0), [rnd(3, 4), rnd(3, 4)])



flat = {f"{c}.{k}": v for c, entry in cases.items() for k, v in entry.items()}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ops.safetensors")
write_safetensors(out, flat, "tests/gen_fixtures.py")
print(f"wrote {len(cases)} cases, {len(flat)} tensors to {out}")
