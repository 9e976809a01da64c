"""A small torch model that is not a GPT, its data, plain-PyTorch reference
training, and a worker that trains the same model through tinyacc's
Accelerator under `tinyacc launch`: the pieces of the torch equivalence
tests (any zero.stage).

The model has an embedding, a LayerNorm, several Linear layers, a weight
shared by two Linear modules, an output head tied to the embedding, a
Linear ("extra") applied only on odd steps (the data flags whole global
batches, so every rank agrees: ZeRO-3 needs every rank to run the same
modules), unused on the others, and a parameter of the root ("rare") added
only to rows that start with token 0 or 1, so it is unused on some ranks
in some steps and on every rank in others.

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
        self.rare = torch.nn.Parameter(torch.full((WIDTH,), 0.5))

    def forward(self, x, flag):
        h = self.norm(self.emb(x).mean(1))
        h = self.fc2(torch.tanh(self.fc1(h)))
        h = torch.tanh(self.proj_b(torch.tanh(self.proj_a(h))))
        if bool(flag.any()):
            h = h + flag.unsqueeze(1) * self.extra(h)
        sel = x[:, 0] < 2
        if bool(sel.any()):
            h = torch.where(sel[:, None], h + self.rare, h)
        return self.head(h)


def dataset(n, steps=None):
    """n samples (x, flag, y); with steps (global batches), flag marks
    every sample of the odd global batches, without, every 16th sample from
    index 5."""
    g = torch.Generator()
    g.manual_seed(7)
    x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (n,), generator=g)
    if steps:
        flag = torch.tensor([1.0 if (i // (n // steps)) % 2 == 1 else 0.0 for i in range(n)])
    else:
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


def reference(opt_kind, steps, global_batch, clip, sched=False, autocast=False):
    """Plain PyTorch, one process: step s trains on samples
    [s·global_batch, (s+1)·global_batch), with new_scheduler when sched,
    the forward under torch.autocast("cpu", torch.bfloat16) when autocast.
    Returns losses, clip norms and the final state dict."""
    torch.set_num_threads(1)
    model = new_model()
    opt = make_optimizer(opt_kind, model.parameters())
    lr = new_scheduler(opt) if sched else None
    ds = dataset(steps * global_batch, steps)
    losses, norms = [], []
    for s in range(steps):
        x, flag, y = ds[s * global_batch:(s + 1) * global_batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x, flag)
        loss = F.cross_entropy(out.float(), y)
        loss.backward()
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        if lr is not None:
            lr.step()
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


class BucketGate:
    """Stands in for the library object of the DDP engine (tinyacc.torch_ddp's
    lib) and of ZeRO-2's (tinyacc.torch_zero_shard's): bucket all-reduces
    and started reduce-scatters start as usual, but no wait for them (nor a
    blocking all-reduce or reduce-scatter) returns before open(), which the
    worker calls once loss.backward() has returned.
    An engine that waits for a bucket while backward still runs waits for
    an open() that cannot come, and fails after the deadline instead of
    hanging. withheld[k] is how many buckets (windows) backward k issued,
    all still withheld when it ended."""

    def __init__(self, lib, deadline):
        import threading
        self._lib, self._deadline = lib, deadline
        self._open = threading.Event()
        self._issued = 0
        self.withheld = []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def tinyacc_bucket_ready(self, reducer, bucket):
        self._issued += 1
        return self._lib.tinyacc_bucket_ready(reducer, bucket)

    def _hold(self, what):
        if not self._open.wait(self._deadline):
            raise RuntimeError("gate: %s while backward was still running (withheld until it returned; %gs passed)"
                               % (what, self._deadline))

    def tinyacc_buckets_wait(self, reducer):
        self._hold("the bucket all-reduces were waited for")
        return self._lib.tinyacc_buckets_wait(reducer)

    def tinyacc_all_reduce(self, *args):
        self._hold("a blocking all-reduce was called")
        return self._lib.tinyacc_all_reduce(*args)

    def tinyacc_reduce_scatter_start(self, *args):
        self._issued += 1
        return self._lib.tinyacc_reduce_scatter_start(*args)

    def tinyacc_collective_wait(self, handle):
        self._hold("a started reduce-scatter was waited for")
        return self._lib.tinyacc_collective_wait(handle)

    def tinyacc_reduce_scatter(self, *args):
        self._hold("a blocking reduce-scatter was called")
        return self._lib.tinyacc_reduce_scatter(*args)

    def open(self):
        self.withheld.append(self._issued)
        self._issued = 0
        self._open.set()

    def close(self):
        self._open.clear()


def overlap_worker(args):
    """Trains DeepModel a few steps with a trace; rank 0 writes the trace
    path, each step's grad data_ptrs and whether each lies in a bucket.
    With args["gate"], the engine's bucket all-reduces (DDP) or gradient
    reduce-scatters (zero.stage 2) go through a BucketGate, opened when each
    backward has returned; rank 0 also writes the gate's counts and, at
    ZeRO-2, the reduce-scatter windows of one backward and how many may
    travel at once (and no trace or gradient pointers: it keeps none)."""
    torch.set_num_threads(1)
    from tinyacc import Accelerator
    from tinyacc import torch_ddp, torch_zero_shard
    gate = None
    if args.get("gate"):
        gate = BucketGate(torch_ddp.lib, 5.0)
        torch_ddp.lib = torch_zero_shard.lib = gate
    acc = Accelerator(args["config"])
    torch.manual_seed(0)
    model = DeepModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    if gate is not None:
        engine = model._engine
        finish = engine.after_backward

        def after_backward():
            gate.open()  # backward has returned: the withheld buckets may complete
            finish()
            gate.close()
        engine.after_backward = after_backward
    zero = args["config"].get("zero", {}).get("stage", 0)
    ptrs = []
    for _ in range(args["steps"]):
        x = torch.randn(1024, 384)
        acc.backward(model(x))
        if not zero:
            ptrs.append({n: p.grad.data_ptr() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    if zero:
        eng = model._engine
        windows = sum(len(list(g.windows(eng.buckets.width))) for g in eng.groups)
        acc.end_training()
        if acc.is_main_process:
            with open(args["out"], "w") as f:
                json.dump({"windows": windows, "inflight": eng.buckets.INFLIGHT, "withheld": gate.withheld}, f)
        return
    spans = [(b.data_ptr(), b.data_ptr() + 4 * b.numel()) for b in model._engine.buckets]
    inside = {n: any(a <= p.grad.data_ptr() and p.grad.data_ptr() + 4 * p.numel() <= b for a, b in spans)
              for n, p in model.named_parameters()}
    acc.end_training()
    if acc.is_main_process:
        with open(args["out"], "w") as f:
            json.dump({"ptrs": ptrs, "inside": inside, "buckets": len(spans),
                       "withheld": gate.withheld if gate is not None else None}, f)


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


def new_scheduler(opt):
    """A torch LR schedule the reference and the prepared optimizer share."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.5 * s))


def held_bytes(model, opt):
    """The bytes this rank's parameter tensors really hold: the sizes of
    the storages torch allocated for the model's parameters and the
    optimizer's (each storage once), whatever the engine's bookkeeping
    says."""
    seen, n = set(), 0
    params = list(model.parameters()) + [p for g in opt.param_groups for p in g["params"]]
    for p in params:
        st = p.untyped_storage() if hasattr(p, "untyped_storage") else p.storage()  # torch < 2.0: storage()
        size = st.nbytes()
        if size and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            n += size
    return n


def train_case(case, out_dir):
    """Trains RefModel through a fresh Accelerator with case: opt, steps,
    batch (per rank), grad_accum, clip, sched (a torch LR scheduler on the
    prepared optimizer), config (a dict for Accelerator), resume_at (save
    the state after that many steps, then go on with a new model, optimizer
    and loader that load it). Returns (accelerator, result): losses (the
    mean over every rank and micro-batch of a step), clip norms, grad
    data_ptrs, memory rows (last, and the peak of gradient + optimizer
    bytes around each step), the parameter bytes every rank's tensors hold
    (held_peak: the most after any backward or step; held_end: at the end;
    see held_bytes) and the saved model's directory."""
    from tinyacc import Accelerator
    G = int(case["grad_accum"])
    N = None
    ds = None

    def build(seed):
        acc = Accelerator(case.get("config") or {}, gradient_accumulation_steps=G,
                          mixed_precision=case.get("mixed_precision"))
        model = new_model()
        if seed is not None:  # other weights, to show load_state replaces them
            torch.manual_seed(seed)
            model = RefModel()
        opt = make_optimizer(case["opt"], model.parameters())
        loader = torch.utils.data.DataLoader(ds, batch_size=case["batch"], shuffle=False)
        model, opt, loader = acc.prepare(model, opt, loader)
        sched = new_scheduler(opt) if case.get("sched") else None
        return acc, model, opt, loader, sched

    from tinyacc import distributed
    N = distributed.world_size()
    ds = dataset(case["steps"] * case["batch"] * N * G, case["steps"])
    acc, model, opt, loader, sched = build(None)
    res = {"losses": [], "norms": [], "ptrs": [], "peak": 0, "held_peak": 0}
    state_dir = os.path.join(out_dir, "state")

    def run(acc, model, opt, loader, sched, stop=None):
        acc_loss = 0.0
        for x, flag, y in loader:
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x, flag), y)
                acc.backward(loss)
                res["held_peak"] = max(res["held_peak"], held_bytes(model, opt))
                acc_loss += float(acc.reduce(loss.detach(), "mean")) / G
                if acc.sync_gradients:
                    # Whether every reduced gradient is a bfloat16 value
                    # (ddp.reduce_dtype=bf16 leaves nothing else).
                    res.setdefault("grads_bf16", []).append(all(
                        p.grad is None or torch.equal(p.grad, p.grad.to(torch.bfloat16).float())
                        for p in model.parameters()))
                    if case.get("clip"):
                        res["norms"].append(float(acc.clip_grad_norm_(model.parameters(), case["clip"])))
                    res["losses"].append(acc_loss)
                    acc_loss = 0.0
                    res["ptrs"].append({n: p.grad.data_ptr() for n, p in model.named_parameters() if p.grad is not None})
                    m = acc.memory()
                    res["peak"] = max(res["peak"], m["grads_bytes"] + m["optim_bytes"] + m["bucket_bytes"])
                opt.step()
                res["held_peak"] = max(res["held_peak"], held_bytes(model, opt))
                if acc.sync_gradients:
                    m = acc.memory()
                    res["peak"] = max(res["peak"], m["grads_bytes"] + m["optim_bytes"] + m["bucket_bytes"])
                    if sched is not None:
                        sched.step()
                opt.zero_grad()
                if acc.sync_gradients and stop is not None and len(res["losses"]) == stop:
                    return

    if case.get("resume_at"):
        run(acc, model, opt, loader, sched, stop=case["resume_at"])
        acc.save_state(state_dir)
        acc._torch.close()
        acc, model, opt, loader, sched = build(999)
        acc.load_state(state_dir)
    run(acc, model, opt, loader, sched)
    model_dir = os.path.join(out_dir, "model")
    acc.save_model(model, model_dir)
    res["memory"] = acc.memory()
    # Every rank's figures (a collective: every rank runs every case).
    res["held_end"] = [int(v) for v in acc.gather(torch.tensor([float(held_bytes(model, opt))])).tolist()]
    res["held_peak"] = [int(v) for v in acc.gather(torch.tensor([float(res["held_peak"])])).tolist()]
    res["model"] = model_dir
    res["world"] = N
    return acc, res


def worker(args):
    """Runs args["cases"] one after the other (each a fresh Accelerator,
    model, optimizer and loader; see train_case); rank 0 writes the list of
    results to args["out"], each case's files under out's directory/<k>."""
    torch.set_num_threads(1)
    base = os.path.dirname(args["out"])
    results, acc = [], None
    for k, case in enumerate(args["cases"]):
        if acc is not None:
            acc._torch.close()
        acc, res = train_case(case, os.path.join(base, str(k)))
        results.append(res)
    acc.end_training()
    if acc.is_main_process:
        with open(args["out"], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    if a.get("overlap"):
        overlap_worker(a)
    elif a.get("metrics"):
        metrics_worker(a)
    else:
        worker(a)
