#!/usr/bin/python3
"""Reference values from PyTorch for memgrad's learned-scale fake quantization (LSQ).

Writes tests/fixtures/fake_quantize_learned.safetensors: for every case NAME, the input NAME.x, the
scale NAME.scale, the zero point NAME.zero_point (per tensor only), NAME.grad_factor, the output
NAME.out, the gradient given to backward NAME.gout and the gradients NAME.dx and NAME.dscale, all
f32 (the ops compute in f32) from torch._fake_quantize_learnable_per_{tensor,channel}_affine.
tests/ops/test_fake_quantize_learned.cpp runs ops/fake_quantize_learned.h on the same inputs.
Every case has values clamped below and above the range. Run by hand when cases change:
    OMP_NUM_THREADS=2 /usr/bin/python3 tests/gen_quant_fixtures.py
(Debian's python3-torch). The test suite itself needs no Python.
"""
import math
import os

import torch

from safetensors_writer import write_safetensors  # tests/safetensors_writer.py

torch.manual_seed(20260311)
cases = {}


def rnd(*shape, lo=-1.0, hi=1.0):
    return torch.rand(tuple(shape), dtype=torch.float32) * (hi - lo) + lo


def run(name, fn, x, scale, extra):
    xg, sg = x.clone().requires_grad_(True), scale.clone().requires_grad_(True)
    out = fn(xg, sg)
    gout = rnd(*out.shape)
    out.backward(gout)
    cases[name] = {"x": x, "scale": scale, **extra, "out": out.detach(), "gout": gout, "dx": xg.grad,
                   "dscale": sg.grad}


def per_tensor(name, shape, lo, hi, scale, zero_point):
    """u8 activations, 0..255 with a zero point; x spans past the range on both sides."""
    x = rnd(*shape, lo=lo, hi=hi)
    gf = 1.0 / math.sqrt(x.numel() * 255)
    s, z = torch.tensor([scale], dtype=torch.float32), torch.tensor([float(zero_point)], dtype=torch.float32)
    run(name, lambda xg, sg: torch._fake_quantize_learnable_per_tensor_affine(xg, sg, z, 0, 255, gf), x, s,
        {"zero_point": torch.tensor([zero_point], dtype=torch.int64),
         "grad_factor": torch.tensor([gf], dtype=torch.float64)})


def per_channel(name, shape):
    """Symmetric int8 weights, -127..127, zero point 0; each scale a random 0.4..1.2 of max|w_c| / 127."""
    w = rnd(*shape, lo=-0.7, hi=0.9)
    amax = w.abs().reshape(shape[0], -1).amax(dim=1)
    s = (amax / 127 * rnd(shape[0], lo=0.4, hi=1.2)).float()
    inner = w.numel() // shape[0]
    gf = 1.0 / math.sqrt(inner * 127)
    z = torch.zeros(shape[0], dtype=torch.float32)
    run(name, lambda xg, sg: torch._fake_quantize_learnable_per_channel_affine(xg, sg, z, 0, -127, 127, gf), w, s,
        {"grad_factor": torch.tensor([gf], dtype=torch.float64)})


per_tensor("per_tensor_zp60", (4, 5, 7), -3.0, 5.0, 0.02, 60)
per_tensor("per_tensor_zp0", (2, 3, 6, 6), -0.5, 7.0, 6.0 / 255, 0)
per_channel("per_channel_conv", (6, 3, 3, 3))
per_channel("per_channel_linear", (5, 8))



flat = {f"{c}.{k}": v for c, entry in cases.items() for k, v in entry.items()}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "fake_quantize_learned.safetensors")
write_safetensors(out, flat, "tests/gen_quant_fixtures.py")
print(f"wrote {len(cases)} cases, {len(flat)} tensors to {out}")
