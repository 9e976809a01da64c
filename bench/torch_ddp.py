"""One side of `tinyacc bench torch`: the same ~10M-parameter torch model
and loop, timed per step, either through tinyacc's Accelerator (--side
tinyacc, zero.stage --stage) or torch.nn.parallel.DistributedDataParallel
on gloo (--side ddp). Started under `tinyacc launch --nproc N` (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT); each rank writes
OUT/rank<r>.json: ms per step (rank 0 times the steps after a barrier) and
this rank's gradient and optimizer-state bytes.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

VOCAB, WIDTH, DEPTH, SEQ = 1024, 1024, 8, 8


class Net(torch.nn.Module):
    """Embedding (tied to the head), LayerNorm, DEPTH Linear layers:
    1024·1024 + DEPTH·(1024·1024 + 1024) + 2·1024 ≈ 9.4M parameters."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        h = self.norm(self.emb(x).mean(1))
        for m in self.layers:
            h = h + torch.tanh(m(h))
        return self.head(h)


def opt_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=["tinyacc", "ddp"], required=True)
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Net()
    nparams = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    batches = [(torch.randint(0, VOCAB, (a.batch, SEQ), generator=g), torch.randint(0, VOCAB, (a.batch,), generator=g))
               for _ in range(4)]

    if a.side == "tinyacc":
        from tinyacc import Accelerator
        acc = Accelerator({"zero": {"stage": a.stage}})
        model, opt = acc.prepare(model, opt)
        rank, barrier = acc.process_index, acc.wait_for_everyone

        def step(x, y):
            acc.backward(F.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()

        def grad_bytes():
            return acc.memory()["grads_bytes"], acc.memory()["optim_bytes"]
        bucket = float(acc.config.ddp.bucket_mb) * (1 << 20)
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
        rank, barrier = dist.get_rank(), dist.barrier
        ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)

        def step(x, y):
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()

        def grad_bytes():
            # With gradient_as_bucket_view the grads are the buckets.
            return sum(p.grad.numel() * 4 for p in model.parameters() if p.grad is not None), opt_bytes(opt)
        bucket = 25 * (1 << 20)

    for i in range(a.warmup):
        step(*batches[i % len(batches)])
    barrier()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(*batches[i % len(batches)])
    barrier()
    ms = 1000 * (time.perf_counter() - t0) / a.steps
    gb, ob = grad_bytes()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "rank%d.json" % rank), "w") as f:
        json.dump({"ms_step": ms, "grads_bytes": gb, "optim_bytes": ob, "params": nparams,
                   "largest_param_bytes": largest, "bucket_bytes": bucket}, f)
    if a.side == "tinyacc":
        acc.end_training()


if __name__ == "__main__":
    main()
