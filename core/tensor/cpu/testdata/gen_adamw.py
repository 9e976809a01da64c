"""Writes adamw_torch.bin: torch.optim.AdamW reference data for TestAdamWMatchesTorch.

Layout (little-endian float32, n = 4096): initial params, the gradients of
steps 1..3, then the params after the third step. Run with the Python that
has torch 1.13: /usr/bin/python3 testdata/gen_adamw.py
"""
import numpy as np
import torch

torch.manual_seed(0)
n = 4096
p0 = torch.randn(n)
grads = [torch.randn(n) * 0.3 for _ in range(3)]
param = torch.nn.Parameter(p0.clone())
opt = torch.optim.AdamW([param], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
for g in grads:
    param.grad = g.clone()
    opt.step()
parts = [p0.numpy()] + [g.numpy() for g in grads] + [param.detach().numpy()]
np.concatenate(parts).astype("<f4").tofile("adamw_torch.bin")
print("torch", torch.__version__)
