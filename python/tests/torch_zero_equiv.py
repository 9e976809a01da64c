"""ZeRO-1/2/3 engines driven directly on a small torch model (embedding,
LayerNorm, Linear layers, a weight shared by the embedding and the head, a
layer used only on odd steps, a root parameter used row-wise) against
plain PyTorch in one process with the global batch: per-step losses (1e-5
relative), the norm clip_grad_norm_ returns, the final weights (1e-4
norm-wise) and the optimizer state. test_torch_zero.py uses its pieces in
one process; run under `tinyacc launch --nproc N` (main), every rank checks
ZeRO-3 on an nn.Sequential with an in-place ReLU, on blocks in a
ModuleList, and zero.wrap=Linear, and
prints one "ok ..." line per check."""

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
        self.rare = nn.Parameter(torch.full((D,), 0.5))  # only for rows starting with token 0 or 1

    def forward(self, x, use_extra):
        h = self.ln(self.emb(x).mean(dim=1))
        h = h + self.fc2(torch.tanh(self.fc1(h)))
        if use_extra:
            h = h + self.extra(h)
        sel = x[:, 0] < 2
        if bool(sel.any()):  # row-wise, so a rank without such rows leaves it out of its graph
            h = torch.where(sel[:, None], h + self.rare, h)
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


def reference(opt_name, world, accum, steps=STEPS):
    model, opt = make(opt_name)
    losses, norms = [], []
    rows = world * accum * MICRO
    for step in range(steps):
        x, y = data(step, rows)
        loss = F.cross_entropy(model(x, step % 2 == 1), y)
        loss.backward()
        if opt_name == "adamw":
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return model, opt, losses, norms


def run(stage, opt_name, accum, rank, world, wrap=None, state=None, start=0, steps=STEPS, shard="auto"):
    """Trains steps [start, start + steps) under ZeRO; state: (model state,
    optimizer state) to start from."""
    model, opt = make(opt_name)
    acc = types.SimpleNamespace(process_index=rank, num_processes=world,
                                config={"ddp": {"bucket_mb": BUCKET_MB}, "zero": {"stage": stage, "wrap": wrap}})
    eng = ZeroEngine(acc, model, opt, stage, shard)
    model, zopt = eng.wrap_module(), eng.wrap_optimizer()
    if state is not None:
        eng.load_model_state(state[0])
        zopt.load_state_dict(state[1])
    losses, norms, peak, partial = [], [], 0, 0
    for step in range(start, start + steps):
        x, y = data(step, world * accum * MICRO)
        total, rare = 0.0, 0.0
        for j in range(accum):
            eng.set_sync(j == accum - 1)
            lo = (j * world + rank) * MICRO
            xs = x[lo:lo + MICRO]
            rare = max(rare, float((xs[:, 0] < 2).any()))
            loss = F.cross_entropy(model(xs, step % 2 == 1), y[lo:lo + MICRO]) / accum
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
        t = dist.all_reduce([total, rare]).tolist()
        losses.append(t[0] / world)
        partial += 0 < t[1] < world  # "rare" unused on some ranks only
    return eng, zopt, losses, norms, peak, partial


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(b), 1e-12)


def norm_err(got, want):
    return float(torch.norm(got.float() - want.float())) / max(float(torch.norm(want.float())), 1e-12)


def check_run(tag, got, ref_model, ref_opt, ref_losses, ref_norms):
    eng, zopt, losses, norms, peak, partial = got
    for s, (a, b) in enumerate(zip(losses, ref_losses[-len(losses):])):
        assert close(a, b, 1e-5), "%s step %d: loss %r, plain torch %r" % (tag, s, a, b)
    assert len(norms) == len(losses) if ref_norms else not norms
    for s, (a, b) in enumerate(zip(norms, ref_norms[-len(norms):] if norms else [])):
        assert close(a, b, 1e-5), "%s step %d: clip norm %r, plain torch %r" % (tag, s, a, b)
    sd = eng.full_state_dict()
    names = dict(ref_model.named_parameters())
    assert list(sd) == list(names), (list(sd), list(names))
    for name, want in names.items():
        err = norm_err(sd[name], want.detach())
        assert err <= 1e-4, "%s: weight %s differs from plain torch by %g norm-wise" % (tag, name, err)
    osd, ref = zopt.state_dict(), ref_opt.state_dict()
    assert [{k: v for k, v in g.items()} for g in osd["param_groups"]] == ref["param_groups"], tag
    assert sorted(osd["state"]) == sorted(ref["state"]), (tag, sorted(osd["state"]), sorted(ref["state"]))
    for pos, st in ref["state"].items():
        assert sorted(osd["state"][pos]) == sorted(st), tag
        for k, v in st.items():
            err = norm_err(osd["state"][pos][k], v)
            assert err <= 1e-4, "%s: optimizer state %d.%s differs by %g" % (tag, pos, k, err)
    return sd, osd


class Stack(nn.Module):
    """Blocks in a ModuleList, which has no forward of its own: the default
    units are its Linear layers."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        for b in self.blocks:
            x = x + torch.tanh(b(x))
        return self.out(x)


class CheckpointedStack(Stack):
    """Stack whose blocks (units) run under torch.utils.checkpoint: their
    forward runs again in backward, the unit gathered for it."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        if self.reentrant:
            x = x.clone().requires_grad_()  # the reentrant form differentiates only inputs that require it
        for b in self.blocks:
            x = x + torch.tanh(checkpoint(b, x, use_reentrant=self.reentrant))
        return self.out(x)


def make_sequential():
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(inplace=True), nn.Linear(12, 12), nn.LayerNorm(12),
                         nn.Linear(12, 3))


def sequential(rank, world, build=make_sequential):
    """ZeRO-3 on build() (default: an nn.Sequential whose ReLU(inplace=True)
    rewrites a unit's output in place) against plain torch (SGD, 3 steps)."""
    def make_seq():
        torch.manual_seed(1)
        m = build()
        return m, torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.5)
    ref, ref_opt = make_seq()
    m, opt = make_seq()
    acc = types.SimpleNamespace(process_index=rank, num_processes=world, config={"ddp": {"bucket_mb": BUCKET_MB}})
    eng = ZeroEngine(acc, m, opt, 3)
    zopt = eng.wrap_optimizer()
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(4 * world, 6, generator=g), torch.randn(4 * world, 3, generator=g)
        want = F.mse_loss(ref(x), y)
        want.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss = F.mse_loss(m(x[4 * rank:4 * rank + 4]), y[4 * rank:4 * rank + 4])
        loss.backward()
        eng.after_backward()
        zopt.step()
        zopt.zero_grad()
        got = dist.all_reduce([float(loss)], "mean").tolist()[0]
        assert close(got, float(want), 1e-5), (step, got, float(want))
    sd = eng.full_state_dict()
    for name, want in ref.named_parameters():
        assert norm_err(sd[name], want.detach()) <= 1e-4, name


def main():
    """What the Accelerator's equivalence tests (test_torch_ddp.py) do not
    cover: ZeRO-3 on an nn.Sequential with an in-place ReLU, on blocks in a
    ModuleList (plain and under torch.utils.checkpoint), and zero.wrap
    by class name on a model whose root owns parameters, one of them unused
    on some ranks only; stages 1-2 sharded by whole parameters beside
    element ranges."""
    rank, world = dist.init()
    sequential(rank, world)
    print("ok sequential stage=3 world=%d" % world, flush=True)
    sequential(rank, world, Stack)
    print("ok modulelist stage=3 world=%d" % world, flush=True)
    for reentrant in (False, True):
        sequential(rank, world, lambda: CheckpointedStack(reentrant))
        print("ok checkpoint reentrant=%s stage=3 world=%d" % (reentrant, world), flush=True)
    ref_model, ref_opt, ref_losses, ref_norms = reference("adamw", world, 3)
    got = run(3, "adamw", 3, rank, world, wrap=["Linear"])
    check_run("wrap=Linear", got, ref_model, ref_opt, ref_losses, ref_norms)
    assert got[5] > 0, "no step had the rare parameter unused on only some ranks"
    print("ok wrap=Linear stage=3 world=%d" % world, flush=True)
    # Stages 1-2 in both forms, the optimizer state compared whole: element
    # ranges (torch's AdamW and SGD) and whole parameters (the form every
    # other optimizer gets), which the Accelerator's matrix does not reach.
    for opt_name, accum in (("adamw", 3), ("sgd", 1)):
        ref = reference(opt_name, world, accum)
        for stage in (1, 2):
            for shard in ("auto", "params"):
                got = run(stage, opt_name, accum, rank, world, shard=shard)
                assert got[0].ranges == (shard == "auto"), (stage, shard)
                check_run("%s stage=%d shard=%s" % (opt_name, stage, shard), got, *ref)
                print("ok %s stage=%d shard=%s world=%d" % (opt_name, stage, shard, world), flush=True)


if __name__ == "__main__":
    main()
