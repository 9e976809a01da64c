"""Worker for test_zero_memory_formula: prints, on rank 0, one JSON line per
(zero.stage, ddp.bucket_mb) with accelerator.memory() after two steps of
AdamW on two Linear layers, and the number of parameter elements."""

import json

import torch

from tinyacc import Accelerator

torch.set_num_threads(1)
rows = []
for stage in (0, 1, 2):
    for mb in (0.02, 25):
        acc = Accelerator({"zero": {"stage": stage}, "ddp": {"bucket_mb": mb}})
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = acc.prepare(model, opt)
        for _ in range(2):
            acc.backward(model(torch.randn(4, 64)).square().mean())
            opt.step()
            opt.zero_grad()
        rows.append(dict(stage=stage, bucket_mb=mb, elements=sum(p.numel() for p in model.parameters()),
                         tensors=len(list(model.parameters())), memory=acc.memory()))
        acc.free_memory()
if acc.is_main_process:
    for r in rows:
        print(json.dumps(r))
