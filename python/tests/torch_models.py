"""A small torch model that is not a GPT, its data, plain-PyTorch reference
training, and a worker that trains the same model through tinyacc's
Accelerator under `tinyacc launch`: the pieces of the torch equivalence
tests (any zero.stage).

The model has an embedding, a LayerNorm, several Linear layers, a weight
shared by two Linear modules, an output head tied to the embedding, and a
Linear ("extra") applied only to flagged samples, so it is unused on some
steps altogether and on some ranks in others.

Run as a script, it is the worker: `torch_models.py '<json args>'`.
"""

import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

VOCAB, WIDTH, SEQ = 16, 8, 4
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RefModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.fc1 = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.fc2 = torch.nn.Linear(2 * WIDTH, WIDTH)
        self.proj_a = torch.nn.Linear(WIDTH, WIDTH)
        self.proj_b = torch.nn.Linear(WIDTH, WIDTH)
        self.proj_b.weight = self.proj_a.weight  # shared by two modules
        self.extra = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x, flag):
        h = self.norm(self.emb(x).mean(1))
        h = self.fc2(torch.tanh(self.fc1(h)))
        h = torch.tanh(self.proj_b(torch.tanh(self.proj_a(h))))
        if bool(flag.any()):
            h = h + flag.unsqueeze(1) * self.extra(h)
        return self.head(h)


def dataset(n):
    """n samples (x, flag, y); flag marks every 16th sample from index 5."""
    g = torch.Generator()
    g.manual_seed(7)
    x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (n,), generator=g)
    flag = torch.tensor([1.0 if i % 16 == 5 else 0.0 for i in range(n)])
    return torch.utils.data.TensorDataset(x, flag, y)


def make_optimizer(kind, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    raise ValueError(kind)


def new_model():
    torch.manual_seed(1234)
    return RefModel()


def reference(opt_kind, steps, global_batch, clip):
    """Plain PyTorch, one process: step s trains on samples
    [s·global_batch, (s+1)·global_batch). Returns losses, clip norms and
    the final state dict."""
    torch.set_num_threads(1)
    model = new_model()
    opt = make_optimizer(opt_kind, model.parameters())
    ds = dataset(steps * global_batch)
    losses, norms = [], []
    for s in range(steps):
        x, flag, y = ds[s * global_batch:(s + 1) * global_batch]
        loss = F.cross_entropy(model(x, flag), y)
        loss.backward()
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms, model.state_dict()


def read_model_file(path):
    """The tensors of a float32 .safetensors file in file order, read
    independently of tinyacc: u64 header length, JSON header, raw data."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        assert v["dtype"] == "F32", (k, v)
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out


def launch(cli, nproc, args, tmp_path, env=None, timeout=120):
    """Runs this file as the worker on nproc ranks under `tinyacc launch`;
    returns rank 0's JSON result."""
    out = os.path.join(str(tmp_path), "result.json")
    args = dict(args, out=out)
    e = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1")
    e.update(env or {})
    p = subprocess.run([cli, "launch", "--nproc", str(nproc), "--", "/usr/bin/python3", os.path.abspath(__file__), json.dumps(args)],
                       env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("worker failed (%d):\n%s\n%s" % (p.returncode, p.stdout[-4000:], p.stderr[-4000:]))
    with open(out) as f:
        return json.load(f)


class DeepModel(torch.nn.Module):
    """For the overlap test: a wide first layer whose backward is long,
    behind several small layers whose buckets are announced before it."""

    def __init__(self):
        super().__init__()
        self.wide = torch.nn.Linear(384, 384)
        self.small = torch.nn.ModuleList([torch.nn.Linear(384, 384) for _ in range(3)])

    def forward(self, x):
        h = torch.tanh(self.wide(x))
        for m in self.small:
            h = torch.tanh(m(h))
        return h.pow(2).mean()


def overlap_worker(args):
    """Trains DeepModel a few steps with a trace; rank 0 writes the trace
    path, each step's grad data_ptrs and whether each lies in a bucket."""
    torch.set_num_threads(1)
    from tinyacc import Accelerator
    acc = Accelerator(args["config"])
    torch.manual_seed(0)
    model = DeepModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    ptrs = []
    for _ in range(args["steps"]):
        x = torch.randn(1024, 384)
        acc.backward(model(x))
        ptrs.append({n: p.grad.data_ptr() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    spans = [(b.data_ptr(), b.data_ptr() + 4 * b.numel()) for b in model._engine.buckets]
    inside = {n: any(a <= p.grad.data_ptr() and p.grad.data_ptr() + 4 * p.numel() <= b for a, b in spans)
              for n, p in model.named_parameters()}
    acc.end_training()
    if acc.is_main_process:
        with open(args["out"], "w") as f:
            json.dump({"ptrs": ptrs, "inside": inside, "buckets": len(spans)}, f)


def metrics_worker(args):
    """Iterates a prepared loader over sample ids 0..n-1 (shuffled when
    asked) and gathers them for metrics; rank 0 writes what it gathered
    and what each rank read."""
    from tinyacc import Accelerator
    acc = Accelerator({"train": {"seed": 11}})
    ds = torch.utils.data.TensorDataset(torch.arange(args["n"]))
    loader = acc.prepare(torch.utils.data.DataLoader(ds, batch_size=args["batch"], shuffle=args["shuffle"]))
    gathered, read = [], []
    for (ids,) in loader:
        read.append(ids.tolist())
        gathered.extend(acc.gather_for_metrics(ids).tolist())
    everyone = acc.gather(torch.tensor(sum(read, []))).tolist()
    acc.end_training()
    if acc.is_main_process:
        with open(args["out"], "w") as f:
            json.dump({"gathered": gathered, "read": everyone, "batches": len(read)}, f)


def worker(args):
    """Trains RefModel through the Accelerator with args: opt, steps,
    batch (per rank), grad_accum, clip, config (a dict for Accelerator),
    out. Rank 0 writes losses (the mean over every rank and micro-batch of
    a step), clip norms, the final weights and the trace path."""
    torch.set_num_threads(1)
    from tinyacc import Accelerator
    G = int(args["grad_accum"])
    acc = Accelerator(args.get("config") or {}, gradient_accumulation_steps=G)
    N = acc.num_processes
    model = new_model()
    opt = make_optimizer(args["opt"], model.parameters())
    ds = dataset(args["steps"] * args["batch"] * N * G)
    loader = torch.utils.data.DataLoader(ds, batch_size=args["batch"], shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses, norms, ptrs, acc_loss = [], [], [], 0.0
    for x, flag, y in loader:
        with acc.accumulate(model):
            loss = F.cross_entropy(model(x, flag), y)
            acc.backward(loss)
            acc_loss += float(acc.reduce(loss.detach(), "mean")) / G
            if acc.sync_gradients:
                if args.get("clip"):
                    norms.append(float(acc.clip_grad_norm_(model.parameters(), args["clip"])))
                losses.append(acc_loss)
                acc_loss = 0.0
                ptrs.append({n: p.grad.data_ptr() for n, p in model.named_parameters() if p.grad is not None})
            opt.step()
            opt.zero_grad()
    acc.save_model(model, os.path.join(os.path.dirname(args["out"]), "model"))
    weights = {k: v.tolist() for k, v in acc.unwrap_model(model).state_dict().items()}
    mem = acc.memory()
    acc.end_training()
    if acc.is_main_process:
        with open(args["out"], "w") as f:
            json.dump({"losses": losses, "norms": norms, "weights": weights, "ptrs": ptrs, "memory": mem,
                       "world": N}, f)


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    if a.get("overlap"):
        overlap_worker(a)
    elif a.get("metrics"):
        metrics_worker(a)
    else:
        worker(a)
