"""Data parallel for a torch model: gradients averaged in buckets while
backward still runs.

The layout. Parameters (each once, under its first name) are grouped into
buckets in reverse order of ``module.parameters()``, which is roughly the
order backward finishes their gradients: the first bucket holds at most
``ddp.first_bucket_mb`` MiB (small, so communication starts early), the
others ``ddp.bucket_mb`` (a parameter larger than the cap gets a bucket of
its own). Each bucket is one float32 tensor; every ``p.grad`` is a view
into it, assigned before the first backward and never replaced, so autograd
accumulates straight into the bucket and the engine reduces the tensors'
own memory, registered once with the library: no per-step copy.

Overlap. A hook on each parameter's gradient accumulator (the node
``p.expand_as(p).grad_fn.next_functions[0][0]``; the engine keeps a
reference to it, since autograd would otherwise create a new one whose hook
we never registered) fires once that parameter's gradient is final for this
backward. When the last parameter of a bucket has fired, the bucket is
announced ready and the library starts its all-reduce on its own thread
while autograd continues. ``after_backward`` waits for the round; buckets
with a parameter no rank used are started there.

The arithmetic. With N ranks and G micro-batches per step, each rank's loss
is divided by G (accelerator.backward), gradients accumulate in the
buckets over the G micro-batches (no communication on those that do not
sync), and the all-reduce averages over N:
    grad = (1/N) sum_r (1/G) sum_g dL_rg/dθ,
the gradient of the mean loss over the N·G micro-batches, as one process
computes it over the global batch.

Unused parameters. A parameter no rank has used yet keeps ``grad`` None, as
in plain PyTorch (a small used-mask, one float per parameter, is averaged
with the buckets to know); one used on some ranks gets zeros from the
others. ``ddp.mode: naive`` keeps the same layout but all-reduces each
parameter's gradient after backward, one call per parameter: the plain
form to compare against.

``ddp.reduce_dtype: bf16`` reduces the buckets in bfloat16: each float32
bucket is rounded to bf16 (to nearest even), all-reduced (the ranks' values
summed in float32, averaged, rounded once) and widened back in place, half
the bytes; gradients still accumulate in float32 across micro-batches.
"""

import ctypes

import torch

from . import _lib
from ._lib import check, i64, lib
from .torch_engine import TorchEngine, check_parameters, parse_duration

_MIB = 1 << 20
_AVG = 1


def plan_buckets(sizes, bucket_bytes, first_bucket_bytes):
    """Groups parameter indices (sizes in bytes, in parameter order) into
    buckets in reverse order: the first at most first_bucket_bytes (when
    > 0), the others at most bucket_bytes; a parameter larger than its cap
    fills a bucket alone."""
    buckets, cur, used = [], [], 0
    cap = first_bucket_bytes if first_bucket_bytes > 0 else bucket_bytes
    for i in reversed(range(len(sizes))):
        if cur and used + sizes[i] > cap:
            buckets.append(cur)
            cur, used, cap = [], 0, bucket_bytes
        cur.append(i)
        used += sizes[i]
    if cur:
        buckets.append(cur)
    return buckets


class DDPEngine(TorchEngine):
    """zero.stage 0: every rank holds every parameter, gradient and
    optimizer state; gradients are averaged over the ranks."""

    def __init__(self, accelerator, module, optimizer):
        super().__init__(accelerator, module, optimizer)
        cfg = accelerator.config
        self.world = accelerator.num_processes
        self.rank = accelerator.process_index
        self.mode = cfg.ddp.mode
        if self.mode not in ("bucketed", "naive"):
            raise ValueError("tinyacc: ddp.mode=%r is not one of bucketed, naive" % self.mode)
        named = [(n, p) for n, p in check_parameters(module) if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._fingerprint = self._layout()
        self.sync = True
        self.stepped_backward = False  # a backward since the last step
        self.any_backward = False
        self.timeout = parse_duration(cfg.comm.timeout)
        rd = str(cfg.ddp.reduce_dtype)
        if rd not in ("fp32", "bf16"):
            raise ValueError("tinyacc: ddp.reduce_dtype=%r is not one of fp32, bf16" % rd)
        self.reduce_bf16 = rd == "bf16"

        if self.world > 1:
            # Every rank starts from rank 0's weights, whatever its seed.
            with torch.no_grad():
                for t in module.state_dict(keep_vars=True).values():
                    if t.dtype == torch.float32 and t.is_contiguous() and t.numel():
                        check(lib.tinyacc_broadcast(ctypes.cast(t.data_ptr(), _lib._f32p), t.numel(), 0))
        sizes = [p.numel() * 4 for p in self.params]
        plan = plan_buckets(sizes, float(cfg.ddp.bucket_mb) * _MIB, float(cfg.ddp.first_bucket_mb) * _MIB)
        self.buckets = []       # float32 tensors, the registered memory
        self.bucket_of = {}     # param index -> bucket index
        self.views = [None] * len(self.params)
        self.bucket_params = plan
        for b, idx in enumerate(plan):
            buf = torch.zeros(sum(self.params[i].numel() for i in idx), dtype=torch.float32)
            off = 0
            for i in idx:
                n = self.params[i].numel()
                self.views[i] = buf[off:off + n].view_as(self.params[i])
                self.bucket_of[i] = b
                off += n
            self.buckets.append(buf)
        # used[i] > 0 after the round's all-reduce: some rank used param i.
        self.used = torch.zeros(max(1, len(self.params)), dtype=torch.float32)
        self.seen = [False] * len(self.params)  # ever had a gradient on some rank
        for p, v in zip(self.params, self.views):
            if p.grad is not None:
                v.copy_(p.grad)
            p.grad = v

        self._handles = []
        self.reducer = None
        if self.world > 1 and self.params:
            for buf in self.buckets + [self.used]:
                h = i64()
                check(lib.tinyacc_buffer_register(buf.data_ptr(), buf.numel(), ctypes.byref(h)))
                self._handles.append(_lib.Handle(h.value))
            if self.mode == "bucketed":
                arr = (i64 * len(self._handles))(*[h.handle for h in self._handles])
                h = i64()
                check(lib.tinyacc_reducer_new(arr, len(self._handles), self.timeout, 1 if cfg.trace else 0, ctypes.byref(h)))
                self.reducer = _lib.Handle(h.value)
                if self.reduce_bf16:
                    # The used-mask is a bucket too: an average of zeros and
                    # ones stays positive wherever one rank used the parameter.
                    check(lib.tinyacc_reducer_reduce_dtype(self.reducer.handle, b"bf16"))
        # Hooks on the gradient accumulators; the nodes are kept alive here.
        self._acc_nodes = []
        self._fired = [False] * len(self.params)
        self._pending = [len(idx) for idx in plan]
        for i, p in enumerate(self.params):
            node = p.expand_as(p).grad_fn.next_functions[0][0]
            node.register_hook(self._make_hook(i))
            self._acc_nodes.append(node)

    # -- the model must stay the one prepared ---------------------------------

    def _layout(self):
        return [(id(p), tuple(p.shape), p.data_ptr()) for p in self.module.parameters() if p.requires_grad]

    def before_backward(self):
        if self._layout() != self._fingerprint:
            now = {id(p): n for n, p in self.module.named_parameters() if p.requires_grad}
            old = dict(zip([id(p) for p in self.params], self.names))
            for pid, n in now.items():
                if pid not in old:
                    raise RuntimeError("tinyacc: the model changed after prepare: parameter %r is new; prepare the model again after changing it" % n)
            for pid, n in old.items():
                if pid not in now:
                    raise RuntimeError("tinyacc: the model changed after prepare: parameter %r is gone; prepare the model again after changing it" % n)
            for n, p in zip(self.names, self.params):
                raise RuntimeError("tinyacc: the model changed after prepare: parameter %r was replaced or resized (shape %s); prepare the model again after changing it"
                                   % (n, tuple(p.shape)))
        for i, (n, p) in enumerate(zip(self.names, self.params)):
            if p.grad is None:
                p.grad = self.views[i]
            elif p.grad.data_ptr() != self.views[i].data_ptr():
                raise RuntimeError("tinyacc: the gradient of parameter %r was replaced after prepare (its .grad must stay the engine's view; zero it with optimizer.zero_grad())" % n)
        self._fired = [False] * len(self.params)
        self._pending = [len(idx) for idx in self.bucket_params]

    # -- backward ------------------------------------------------------------

    def _make_hook(self, i):
        def hook(*_):
            if self._fired[i]:
                return
            self._fired[i] = True
            self.used[i] = 1.0
            b = self.bucket_of[i]
            self._pending[b] -= 1
            if self._pending[b] == 0 and self.sync and self.reducer is not None:
                check(lib.tinyacc_bucket_ready(self.reducer.handle, b))
        return hook

    def after_backward(self):
        self.any_backward = True
        self.stepped_backward = True
        if not self.sync:
            return
        if self.world > 1 and self.params:
            if self.reducer is not None:
                check(lib.tinyacc_buckets_wait(self.reducer.handle))
            else:
                for v in self.views:
                    if self.reduce_bf16:
                        # The plain form of the bf16 reduction: the same rule
                        # (rounded, averaged in float32, rounded once), float32 bytes.
                        v.copy_(v.to(torch.bfloat16))
                    check(lib.tinyacc_all_reduce(ctypes.cast(v.data_ptr(), _lib._f32p), v.numel(), _AVG))
                    if self.reduce_bf16:
                        v.copy_(v.to(torch.bfloat16))
                check(lib.tinyacc_all_reduce(ctypes.cast(self.used.data_ptr(), _lib._f32p), self.used.numel(), _AVG))
        for i, p in enumerate(self.params):
            if self.used[i] > 0:
                self.seen[i] = True
            if not self.seen[i]:
                p.grad = None  # no rank ever used it: None, as in plain PyTorch
        self.used.zero_()

    # -- the optimizer -----------------------------------------------------

    def step(self):
        if not self.any_backward:
            raise RuntimeError("tinyacc: optimizer.step() before any accelerator.backward(loss): there are no gradients to apply")
        if self.optimizer is not None:
            self.optimizer.step()
        self.stepped_backward = False

    def zero_grad(self):
        for buf in self.buckets:
            buf.zero_()

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        # After the round every rank holds the whole averaged gradient, so
        # the local norm is the global one.
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters, clip_value):
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- state -------------------------------------------------------------

    def full_state_dict(self):
        return self.module.state_dict()

    def optimizer_state_dict(self):
        return self.optimizer.state_dict() if self.optimizer is not None else {}

    def load_optimizer_state_dict(self, sd):
        if self.optimizer is not None and sd:
            self.optimizer.load_state_dict(sd)

    def load_model_state(self, sd):
        with torch.no_grad():
            own = self.module.state_dict(keep_vars=True)
            missing = [k for k in own if k not in sd]
            if missing:
                raise KeyError("tinyacc: the saved model lacks %s" % ", ".join(missing[:4]))
            for k, t in own.items():
                t.copy_(sd[k])

    def memory(self):
        opt = 0
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                for v in st.values():
                    if torch.is_tensor(v):
                        opt += v.numel() * v.element_size()
        return dict(params_bytes=sum(p.numel() * 4 for p in self.params),
                    grads_bytes=sum(b.numel() * 4 for b in self.buckets),
                    optim_bytes=opt)

    def write_trace(self, path):
        if self.reducer is not None:
            check(lib.tinyacc_reducer_trace(self.reducer.handle, _lib.encode(path)))

    def close(self):
        if self.reducer is not None:
            self.reducer.free()
            self.reducer = None
        for h in self._handles:
            h.free()
        self._handles = []
