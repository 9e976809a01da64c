"""Run under `tinyacc launch --nproc N`: ZeRO-1/2/3 on a small torch model
(embedding, LayerNorm, Linear layers, a weight shared by the embedding and
the head, a layer used only on odd steps) against plain PyTorch in one
process with the global batch, for every combination of stage (argv[1],
comma separated), gradient accumulation 1 and 3, AdamW with clipping and
SGD with momentum without. Every rank computes the reference itself and
checks: per-step losses (1e-5 relative), the norm clip_grad_norm_ returns,
the final weights (1e-4 norm-wise), and at stage 2 the memory bound.
Prints one "ok ..." line per combination."""

import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyacc import distributed as dist
from tinyacc.torch_zero import ZeroEngine

V, D, T, MICRO, STEPS = 16, 8, 4, 2, 4
BUCKET_MB = 256 / float(1 << 20)  # 64 floats: windows of 64 / N columns, parameters straddle them


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, V, bias=False)

    def forward(self, h):
        return self.proj(h)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.ln = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)
        self.extra = nn.Linear(D, D)  # used on odd steps only: grad None at step 0
        self.head = Head()
        self.head.proj.weight = self.emb.weight  # shared by two modules
        self.scale = nn.Parameter(torch.ones(D))  # the root's own parameter

    def forward(self, x, use_extra):
        h = self.ln(self.emb(x).mean(dim=1))
        h = h + self.fc2(torch.tanh(self.fc1(h)))
        if use_extra:
            h = h + self.extra(h)
        return self.head(h * self.scale)


def data(step, rows):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, V, (rows, T), generator=g)
    y = torch.randint(0, V, (rows,), generator=g)
    return x, y


def make(opt_name):
    torch.manual_seed(0)
    model = Net()
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def reference(opt_name, world, accum):
    model, opt = make(opt_name)
    losses, norms = [], []
    rows = world * accum * MICRO
    for step in range(STEPS):
        x, y = data(step, rows)
        loss = F.cross_entropy(model(x, step % 2 == 1), y)
        loss.backward()
        if opt_name == "adamw":
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    grads_bytes = 4 * sum(p.numel() for p in model.parameters())
    optim_bytes = sum(v.element_size() * v.numel() for st in opt.state.values() for v in st.values()
                      if isinstance(v, torch.Tensor))
    return losses, norms, model.state_dict(), grads_bytes + optim_bytes, max(p.numel() for p in model.parameters())


def run(stage, opt_name, accum, rank, world, wrap=None):
    model, opt = make(opt_name)
    acc = types.SimpleNamespace(process_index=rank, num_processes=world,
                                config={"ddp": {"bucket_mb": BUCKET_MB}, "zero": {"stage": stage, "wrap": wrap}})
    eng = ZeroEngine(acc, model, opt, stage)
    model, zopt = eng.wrap_module(), eng.wrap_optimizer()
    losses, norms, peak = [], [], 0
    for step in range(STEPS):
        x, y = data(step, world * accum * MICRO)
        total = 0.0
        for j in range(accum):
            eng.set_sync(j == accum - 1)
            lo = (j * world + rank) * MICRO
            loss = F.cross_entropy(model(x[lo:lo + MICRO], step % 2 == 1), y[lo:lo + MICRO]) / accum
            loss.backward()
            eng.after_backward()
            total += float(loss)
            m = eng.memory()
            peak = max(peak, m["grads_bytes"] + m["optim_bytes"])
        if opt_name == "adamw":
            norms.append(float(eng.clip_grad_norm_(model.parameters(), 0.5)))
        zopt.step()
        m = eng.memory()
        peak = max(peak, m["grads_bytes"] + m["optim_bytes"])
        zopt.zero_grad()
        losses.append(float(dist.all_reduce([total], "mean").tolist()[0]))
    return losses, norms, eng.full_state_dict(), peak


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(b), 1e-12)


def main():
    rank, world = dist.init()
    stages = [int(s) for s in sys.argv[1].split(",")]
    for stage in stages:
        for opt_name in ("adamw", "sgd"):
            for accum in (1, 3):
                ref_losses, ref_norms, ref_sd, ddp_bytes, largest = reference(opt_name, world, accum)
                losses, norms, sd, peak = run(stage, opt_name, accum, rank, world)
                tag = "stage=%d opt=%s accum=%d world=%d" % (stage, opt_name, accum, world)
                for s, (a, b) in enumerate(zip(losses, ref_losses)):
                    assert close(a, b, 1e-5), "%s step %d: loss %r, plain torch %r" % (tag, s, a, b)
                for s, (a, b) in enumerate(zip(norms, ref_norms)):
                    assert close(a, b, 1e-5), "%s step %d: clip norm %r, plain torch %r" % (tag, s, a, b)
                assert len(norms) == len(ref_norms)
                for name, want in ref_sd.items():
                    got = sd[name] if name in sd else sd["emb.weight"]
                    err = float(torch.norm(got - want)) / max(float(torch.norm(want)), 1e-12)
                    assert err <= 1e-4, "%s: weight %s differs from plain torch by %g norm-wise" % (tag, name, err)
                if stage == 2:
                    bound = ddp_bytes / world + BUCKET_MB * (1 << 20) + 4 * largest
                    assert peak <= bound, "%s: optimizer + gradient bytes %d > DDP's %d / %d + bucket + largest" % (
                        tag, peak, ddp_bytes, world)
                print("ok %s peak=%d ddp=%d" % (tag, peak, ddp_bytes), flush=True)


if __name__ == "__main__":
    main()
