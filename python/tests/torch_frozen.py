"""A torch model with a frozen backbone (requires_grad=False), its data, a
plain-PyTorch reference, and the worker that trains it through
Accelerator.prepare under `tinyacc launch` at each zero.stage, reading the
bytes the library sent around every step (tinyacc.distributed.sent_bytes).

The trainable parameters have no bias, so each default ZeRO-3 unit (a
direct child of the root) holds exactly one trainable tensor and its shard
block is that tensor, with no padding: the test's byte formula then needs
only the trainable parameters' sizes.

Run as a script, it is the worker: `torch_frozen.py '<json args>'`.
"""

import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

IN, WIDTH, OUT = 6, 16, 4
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FrozenBackbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(IN, WIDTH), torch.nn.Tanh(),
                                            torch.nn.Linear(WIDTH, WIDTH))
        self.adapter = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.head = torch.nn.Linear(WIDTH, OUT, bias=False)
        self.scale = torch.nn.Parameter(torch.full((WIDTH,), 0.75))  # the root's own, frozen too
        for p in list(self.backbone.parameters()) + [self.scale]:
            p.requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(self.backbone(x)) * self.scale
        return self.head(h + torch.tanh(self.adapter(h)))


def new_model():
    torch.manual_seed(4321)
    return FrozenBackbone()


def dataset(n):
    g = torch.Generator()
    g.manual_seed(11)
    return torch.utils.data.TensorDataset(torch.randn(n, IN, generator=g), torch.randint(0, OUT, (n,), generator=g))


def optimizer(params):
    # Over every parameter, frozen ones included, as scripts often write it:
    # torch skips a parameter without a gradient.
    return torch.optim.AdamW(params, lr=3e-2, weight_decay=0.1)


def reference(steps, global_batch, autocast=False):
    """One process, plain PyTorch: step s on samples [s·gb, (s+1)·gb), the
    forward under torch.autocast("cpu", torch.bfloat16) when autocast."""
    torch.set_num_threads(1)
    model = new_model()
    opt = optimizer(model.parameters())
    ds = dataset(steps * global_batch)
    losses = []
    for s in range(steps):
        x, y = ds[s * global_batch:(s + 1) * global_batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def train(case, steps, batch):
    from tinyacc import Accelerator, distributed
    case = dict(case)
    acc = Accelerator(case, mixed_precision=case.pop("mixed_precision", None))
    world = distributed.world_size()
    model = new_model()
    opt = optimizer(model.parameters())
    loader = torch.utils.data.DataLoader(dataset(steps * batch * world), batch_size=batch, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    res = {"losses": [], "sent": []}
    for x, y in loader:
        before = distributed.sent_bytes()
        loss = F.cross_entropy(model(x).float(), y)  # the prepared forward runs under autocast when bf16
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        res["sent"].append(distributed.sent_bytes() - before)
        res["losses"].append(float(acc.reduce(loss.detach(), "mean")))
    res["sent_per_rank"] = [[int(v) for v in acc.gather(torch.tensor([float(b)])).tolist()] for b in res["sent"]]
    res["weights"] = {k: v.tolist() for k, v in acc.get_state_dict(model).items()}
    return acc, res


def worker(args):
    torch.set_num_threads(1)
    results, acc = [], None
    for case in args["cases"]:
        if acc is not None:
            acc._torch.close()
        acc, res = train(case, args["steps"], args["batch"])
        results.append(res)
    acc.end_training()
    if acc.is_main_process:
        with open(args["out"], "w") as f:
            json.dump(results, f)


def launch(cli, nproc, args, tmp_path, timeout=180):
    """Runs this file as the worker on nproc ranks; rank 0's results."""
    out = os.path.join(str(tmp_path), "frozen.json")
    args = dict(args, out=out)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1")
    p = subprocess.run([cli, "launch", "--nproc", str(nproc), "--", "/usr/bin/python3", os.path.abspath(__file__),
                        json.dumps(args)], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("worker failed (%d):\n%s\n%s" % (p.returncode, p.stdout[-4000:], p.stderr[-4000:]))
    with open(out) as f:
        return json.load(f)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
