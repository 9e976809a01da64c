"""ZeRO stages 1, 2 and 3 for torch models (data-parallel ranks = the world).

PyTorch computes forward and backward in the script's process; this engine
decides where gradients, optimizer state and (at stage 3) parameters live,
and moves them with the world group's collectives (torch_zero_shard).

Stages 1 and 2 shard in one of two forms:

  by element range (torch_zero_range), for torch's SGD, Adam and AdamW,
           whose step is elementwise: each shard group's elements, in one
           flat order, are split into N equal contiguous ranges; the
           script's optimizer is rebuilt in place to hold one Parameter per
           owned piece (a view of the parameter's memory, in its
           param_group, so the hyperparameters and LR schedulers apply);
  by whole parameters (torch_zero_shard), for every other optimizer:
           each rank owns a balanced subset of the parameters and the
           optimizer holds only the owned ones.

Either way each rank steps only what it owns. Stage 3 shards by whole
parameters.

  stage 1  gradients are whole on every rank while a step accumulates; on
           the micro-batch that syncs, one reduce-scatter leaves each owner
           the average of its parameters' gradients; after the step the
           owners' updated parameters are all-gathered. Micro-batches that do
           not sync communicate nothing.
  stage 2  as 1, but every micro-batch reduce-scatters and drops the whole
           gradients: a rank keeps only its shard (sum over micro-batches of
           the rank average), so no whole gradient survives a micro-batch.
           The parameters are cut into buckets (ddp.bucket_mb) in reverse
           order, each with its own owners, and a bucket's reduce-scatter
           starts as soon as its gradients are final and runs while
           backward goes on (Buckets.reduce_scatter_start); after_backward
           waits for them all.
  stage 3  the parameters themselves are sharded (torch_zero3): a unit's
           parameters are gathered before its forward and its backward and
           freed after.

ddp.reduce_dtype=bf16 makes every gradient reduce-scatter of any stage
carry bfloat16 (Buckets; each rank's float32 gradients rounded, summed in
float32 and rounded once by the library): half their bytes, with every
averaged gradient a bfloat16 value. The gradients accumulate, and the
parameters travel, in float32 as before.

Why this equals one process with the global batch: with the loss of each
micro-batch divided by the accumulation steps A, the gradient one process
computes on the global batch of N·A equal micro-batches is
(1/N) Σ_ranks Σ_micro ∇(loss/A), which is what the average over ranks of the
locally accumulated sums gives, whichever rank holds it. A parameter no rank
used since training began keeps grad None (as in plain PyTorch, whose
optimizers skip it); once used anywhere its gradient is a tensor, zeroed
in place by zero_grad, as the prepared optimizer never sets None.

Frozen parameters (requires_grad=False: a frozen backbone, the base under
adapters) have no gradient to average and no optimizer state: they belong
to no shard group, so they get no bucket, no shard and no collective at
any stage; at stage 3 every rank keeps them whole, as a replicated
buffer. Only the broadcast of prepare (every rank starts from rank 0's
parameters and buffers, as torch's DDP does) carries them.

The clip norm is over the global gradient: every owner adds Σ|g|^p of its
averaged parameters' gradients, one all-reduce sums them, and the same
coefficient max_norm / (norm + 1e-6) (torch's) scales every shard.
"""

import collections

import torch

from . import distributed as dist
from .torch_engine import TorchEngine
from .torch_prepare import PreparedOptimizer
from .torch_zero_range import Piece, RangeGroup, elementwise
from .torch_zero_shard import (MAX, SUM, Buckets, InOrder, ShardGroup, all_reduce_, balance, broadcast_,
                               broadcast_object)


def config_value(accelerator, section, key, default):
    """accelerator.config[section][key], or default when absent (a Config,
    a dict, or no config at all)."""
    cfg = getattr(accelerator, "config", None)
    try:
        v = cfg[section][key]
    except (KeyError, TypeError, AttributeError):
        return default
    return default if v is None else v


def unique_parameters(module):
    """(names, params): every parameter once, under its first name, and
    aliases: every name (shared ones too) -> index."""
    names, params, index, aliases = [], [], {}, {}
    for mname, m in module.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is None:
                continue
            full = mname + "." + pname if mname else pname
            if id(p) not in index:
                index[id(p)] = len(params)
                names.append(full)
                params.append(p)
            aliases.setdefault(full, index[id(p)])
    for n, p in zip(names, params):
        if p.dtype != torch.float32:
            raise TypeError("tinyacc: parameter %s is %s; only float32 parameters are supported" % (n, p.dtype))
        if not p.is_contiguous():
            raise ValueError("tinyacc: parameter %s is not contiguous; call .contiguous() on it before prepare" % n)
        if p.device.type != "cpu":
            raise ValueError("tinyacc: parameter %s is on %s; only CPU parameters are supported" % (n, p.device))
    return names, params, index, aliases


class ZeroEngine(TorchEngine):
    """ZeRO stage 1, 2 or 3 over a torch module and its optimizer (None: a
    model without one, whose gradients are still reduced and sharded).
    Every rank starts from rank 0's parameters and buffers, as under
    zero.stage 0."""

    def __init__(self, accelerator, module, optimizer, stage, shard="auto"):
        """shard: "auto" (element ranges at stages 1-2 when the optimizer is
        elementwise, else whole parameters) or "params" (whole parameters)."""
        if stage not in (1, 2, 3):
            raise ValueError("tinyacc: ZeroEngine needs zero.stage 1, 2 or 3, got %r" % (stage,))
        super().__init__(accelerator, module, optimizer)
        self.stage = stage
        self.rank = getattr(accelerator, "process_index", None)
        self.world = getattr(accelerator, "num_processes", None)
        if self.rank is None or self.world is None:
            self.rank, self.world = dist.init()
        self.names, self.params, self.index, self.aliases = unique_parameters(module)
        self._layout = self._fingerprint()
        n = len(self.params)
        # The parameters that are sharded and communicated: the trainable ones.
        self.trainable = [i for i, p in enumerate(self.params) if p.requires_grad]
        self._trainable_set = set(self.trainable)
        if self.world > 1:
            with torch.no_grad():
                for t in module.state_dict(keep_vars=True).values():
                    if t.dtype == torch.float32 and t.is_contiguous() and t.numel():
                        broadcast_(t.data.view(-1), 0)
        self._full_groups = [list(g["params"]) for g in optimizer.param_groups] if optimizer is not None else []
        for g in self._full_groups:
            for p in g:
                if id(p) not in self.index:
                    raise ValueError("tinyacc: the optimizer holds a tensor of shape %s that is not a parameter of the "
                                     "model; create the optimizer from model.parameters()" % (tuple(p.shape),))
        bucket_mb = float(config_value(accelerator, "ddp", "bucket_mb", 25))
        reduce_dtype = str(config_value(accelerator, "ddp", "reduce_dtype", "fp32"))
        if reduce_dtype not in ("fp32", "bf16"):
            raise ValueError("tinyacc: ddp.reduce_dtype=%r is not one of fp32, bf16" % reduce_dtype)
        self.buckets = Buckets(bucket_mb * (1 << 20) / 4, self.world, reduce_dtype)
        self._sync = True
        self._backwards = 0
        self._used_local = [False] * n
        self.has_grad = [False] * n
        # Each parameter's gradient accumulator (kept alive here): its hook
        # runs once per backward, after the gradient is accumulated.
        self._accumulators = []
        for i, p in enumerate(self.params):
            if p.requires_grad:
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                node.register_hook(self._grad_hook(i))
                self._accumulators.append(node)
        self.z3 = self.queue = None
        self.owner = [None] * n
        for i, k in zip(self.trainable, balance([self.params[i].numel() for i in self.trainable], self.world)):
            self.owner[i] = k
        self.ranges = stage < 3 and shard == "auto" and elementwise(optimizer)
        if stage == 1 and self.ranges:
            # No shard: the reduce-scatter writes the averages into the owned
            # pieces of the whole gradients, which stage 1 keeps anyway.
            self.groups = [RangeGroup(self.trainable, self.params, self.rank, self.world, shard=False)]
        elif stage == 1:
            self.groups = [ShardGroup(self.trainable, self.params, self.rank, self.world, self.owner)]
        elif stage == 2:
            self.groups = self._bucket_groups()
            self.queue = InOrder(self.groups, [g.indices for g in self.groups], self._reduce_bucket)
        else:
            from .torch_zero3 import Stage3
            self.z3 = Stage3(self, config_value(accelerator, "zero", "wrap", None))
            self.groups = self.z3.groups
        self.group_of = {i: g for g in self.groups for i in g.indices}
        # Range form: the owned pieces (none of them a whole-owned parameter);
        # whole form: the owned parameters.
        self.pieces = [Piece(i, self.params[i], first, k, grad)
                       for g in self.groups if self.ranges for i, first, k, grad in g.owned_pieces()]
        self._pieces_of = collections.defaultdict(list)
        for pc in self.pieces:
            self._pieces_of[pc.index].append(pc)
        self.owned = [] if self.ranges else [i for g in self.groups for i in g.owned]
        self._owned_set = set(self.owned)
        if stage < 3:
            self._gather_params()  # the owners' values, on every rank
        for g in self._groups():
            g["params"] = self._shard_params(g["params"])
        for p in self.params:
            p.grad = None
        # Whole form, stage 1: an owned parameter's gradient is its place in
        # the shard, so backward accumulates there directly.
        self._grad_in_shard = set(i for i in self.owned if stage == 1 and self.params[i].requires_grad)
        for i in self._grad_in_shard:
            self.params[i].grad = self._shard_view(i)

    # -- the interface ----------------------------------------------------------

    def set_sync(self, sync):
        self.sync = self._sync = bool(sync)

    def before_backward(self):
        """Refuses a model whose parameters changed after prepare (new,
        gone or replaced ones): the shards and hooks were built for the old
        ones."""
        if self._fingerprint() != self._layout:
            now = {id(p): n for n, p in self.module.named_parameters()}
            for pid, n in now.items():
                if pid not in self.index:
                    raise RuntimeError("tinyacc: the model changed after prepare: parameter %r is new; prepare the "
                                       "model again after changing it" % n)
            for n, p in zip(self.names, self.params):
                if id(p) in now and p.requires_grad != (self.index[id(p)] in self._trainable_set):
                    raise RuntimeError("tinyacc: the model changed after prepare: parameter %r now has "
                                       "requires_grad=%s; prepare the model again after freezing or unfreezing "
                                       "parameters" % (n, p.requires_grad))
            gone = [n for n, p in zip(self.names, self.params) if id(p) not in now]
            raise RuntimeError("tinyacc: the model changed after prepare: parameter %r is gone; prepare the model "
                               "again after changing it" % (gone[0] if gone else self.names[0]))

    def after_backward(self):
        self._backwards += 1
        if self.stage == 1 and self.ranges:
            if self._sync:
                # Every parameter used anywhere gets a (zero) gradient to
                # receive its average, one unused everywhere stays None.
                self._exchange_used()
                for i in self.trainable:
                    if self.has_grad[i] and self.params[i].grad is None:
                        self.params[i].grad = torch.zeros_like(self.params[i])
                self.buckets.reduce_scatter(self.groups[0], self._local_grad, None, accumulate=False)
            return
        if self.stage == 1:
            if self._sync:
                self.buckets.reduce_scatter(self.groups[0], self._local_grad, self.groups[0].shard, accumulate=False)
        elif self.stage == 2:
            self.queue.flush()
            self.buckets.finish()
        else:
            self.z3.flush()
        if self._sync:
            self._exchange_used()

    def step(self):
        if self._backwards == 0:
            raise RuntimeError("tinyacc: optimizer.step() was called before any backward; call "
                               "accelerator.backward(loss) first")
        for i in self.owned:
            self.params[i].grad = self._shard_view(i) if self.has_grad[i] else None
        for pc in self.pieces:
            pc.param.grad = self._piece_grad(pc) if self.has_grad[pc.index] else None
        try:
            if self.optimizer is not None:
                self.optimizer.step()
        finally:
            for i in self.owned:
                self.params[i].grad = self._shard_view(i) if i in self._grad_in_shard else None
            for pc in self.pieces:
                pc.param.grad = None
        if self.stage < 3:
            self._gather_params()
        else:
            self.z3.free_all()

    def zero_grad(self):
        for g in self.groups:
            g.shard.zero_()
        for i, p in enumerate(self.params):
            if p.grad is not None and i not in self._grad_in_shard:
                p.grad.zero_()

    def _averaged_grads(self, parameters, what):
        """This rank's averaged gradients of parameters (every element once
        over the ranks: the owned parameters or pieces)."""
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        sel = set()
        for p in parameters:
            if id(p) not in self.index:
                raise ValueError("tinyacc: %s got a tensor of shape %s that is not a parameter of the "
                                 "prepared model" % (what, tuple(p.shape)))
            i = self.index[id(p)]
            if self.has_grad[i]:
                sel.add(i)
        grads = [self._shard_view(i) for i in self.owned if i in sel]
        return grads + [self._piece_grad(pc) for pc in self.pieces if pc.index in sel]

    def clip_grad_value_(self, parameters, clip_value):
        """Clamps each element where its average lives (elementwise, so no
        communication)."""
        for g in self._averaged_grads(parameters, "clip_grad_value_"):
            g.clamp_(-float(clip_value), float(clip_value))

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        grads = self._averaged_grads(parameters, "clip_grad_norm_")
        norm_type = float(norm_type)
        if norm_type == float("inf"):
            local = max([float(g.abs().max()) for g in grads if g.numel()] + [0.0])
            t = torch.tensor([local], dtype=torch.float32)
            all_reduce_(t, MAX)
            total = float(t[0])
        else:
            local = sum(float(torch.norm(g, norm_type)) ** norm_type for g in grads)
            t = torch.tensor([local], dtype=torch.float32)
            all_reduce_(t, SUM)
            total = float(t[0]) ** (1.0 / norm_type)
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return torch.tensor(total, dtype=torch.float32)

    def full_state_dict(self):
        """Every parameter whole (once, under its first name) and every
        buffer, in the module's state_dict order (collective at stage 3)."""
        if self.stage == 3:
            whole = self.z3.gather_whole()
        else:
            whole = {i: p.detach().clone() for i, p in enumerate(self.params)}
        out, done = collections.OrderedDict(), set()
        for name, t in self.module.state_dict(keep_vars=True).items():
            i = self.index.get(id(t))
            if i is None:
                out[name] = t.detach().clone()
            elif i not in done:
                done.add(i)
                out[self.names[i]] = whole[i]
        for i in range(len(self.params)):  # parameters state_dict leaves out (none in torch's modules)
            if i not in done:
                out[self.names[i]] = whole[i]
        return out

    def load_model_state(self, sd):
        buffers = dict(self.module.named_buffers())
        unknown = [k for k in sd if k not in self.aliases and k not in buffers]
        missing = [n for i, n in enumerate(self.names)
                   if not any(self.aliases[k] == i for k in sd if k in self.aliases)]
        if unknown or missing:
            raise KeyError("tinyacc: model state does not match the model: unknown %s, missing %s" % (unknown, missing))
        with torch.no_grad():
            for k, v in sd.items():
                if k in buffers:
                    buffers[k].copy_(v)
                    continue
                i = self.aliases[k]
                p = self.params[i]
                if self.stage == 3 and i in self._trainable_set and i not in self._owned_set:
                    continue
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError("tinyacc: %s has shape %s in the state but %s in the model" % (k, tuple(v.shape), tuple(p.shape)))
                p.copy_(v)

    def optimizer_state_dict(self):
        """The whole optimizer's state_dict, as torch would give it for the
        full parameter list (collective: each owner sends its states)."""
        if self.optimizer is None:
            return {}
        if self.ranges:
            return self._range_state_dict()
        sd = self._with_full_groups(self.optimizer.state_dict)
        state = {}
        for k in range(self.world):
            meta = None
            if k == self.rank:
                meta = {}
                for pos, st in sd["state"].items():
                    meta[pos] = {key: (("t", tuple(v.shape)) if _is_f32(v) else ("v", v)) for key, v in st.items()}
            meta = broadcast_object(meta, k, self.rank)
            for pos in sorted(meta):
                state[pos] = {}
                for key in sorted(meta[pos]):
                    kind, val = meta[pos][key]
                    if kind == "v":
                        state[pos][key] = val
                        continue
                    t = sd["state"][pos][key].detach().clone().contiguous() if k == self.rank else torch.empty(val)
                    broadcast_(t.view(-1), k)
                    state[pos][key] = t
        return {"state": state, "param_groups": sd["param_groups"]}

    def load_optimizer_state_dict(self, sd):
        """Loads a whole state_dict (as optimizer_state_dict gives); each
        rank keeps its owned parameters' states. A parameter with state has
        been stepped, so it had a gradient: it keeps one (zeros) from now."""
        if self.optimizer is None or not sd:
            return
        self._with_full_groups(lambda: self.optimizer.load_state_dict(sd))
        positions = [self.index[id(p)] for g in self._full_groups for p in g]
        for pos in sd["state"]:
            self.has_grad[positions[int(pos)]] = True
        if self.ranges:
            # torch loaded the whole parameters' states: cut each into the
            # owned pieces (a per-element tensor by range, anything else,
            # such as Adam's step tensor that it increments in place, copied).
            whole, state = self.optimizer.state, collections.defaultdict(dict)
            for p, st in whole.items():
                for pc in self._pieces_of[self.index[id(p)]]:
                    state[pc.param] = {k: _cut(pc, p, v) for k, v in st.items()}
            self.optimizer.state = state
            return
        for p in list(self.optimizer.state):
            if self.index[id(p)] not in self._owned_set:
                del self.optimizer.state[p]

    def _range_state_dict(self):
        """optimizer_state_dict in the range form: each parameter's state
        assembled from its pieces' owners. A per-element state is summed
        over the ranks from zeros where a rank owns no piece (x + 0 = x:
        exact); every other value comes from the lowest rank holding one."""
        st = self.optimizer.state
        self.optimizer.state = collections.defaultdict(dict)
        try:
            sd = self._with_full_groups(self.optimizer.state_dict)
        finally:
            self.optimizer.state = st
        positions = [self.index[id(p)] for g in self._full_groups for p in g]
        mine = {}
        for pos, i in enumerate(positions):
            for pc in self._pieces_of[i]:
                for key, v in st.get(pc.param, {}).items():
                    per_element = _is_f32(v) and v.numel() == pc.numel
                    mine.setdefault(pos, {}).setdefault(key, ("t", None) if per_element else ("v", v))
        metas = [broadcast_object(mine if k == self.rank else None, k, self.rank) for k in range(self.world)]
        state = {}
        for pos, i in enumerate(positions):
            keys = {}
            for meta in metas:
                for key, kv in meta.get(pos, {}).items():
                    keys.setdefault(key, kv)
            if not keys:
                continue
            state[pos] = {}
            for key, (kind, val) in keys.items():
                if kind == "v":
                    state[pos][key] = val
                    continue
                p = self.params[i]
                t = torch.zeros(p.numel(), dtype=torch.float32)
                for pc in self._pieces_of[i]:
                    if key in st.get(pc.param, {}):
                        t[pc.first:pc.first + pc.numel].copy_(st[pc.param][key])
                all_reduce_(t, SUM)
                state[pos][key] = t.view(p.shape)
        return {"state": state, "param_groups": sd["param_groups"]}

    def memory(self):
        # Stage 3 holds the owned parameters and every frozen one whole.
        own = range(len(self.params))
        if self.stage == 3:
            own = [i for i in own if i in self._owned_set or i not in self._trainable_set]
        params_bytes = sum(4 * self.params[i].numel() for i in own)
        grads = sum(4 * g.shard.numel() for g in self.groups)
        for i, p in enumerate(self.params):
            if p.grad is not None and i not in self._grad_in_shard:
                grads += p.grad.element_size() * p.grad.numel()
        optim = 0
        for st in (self.optimizer.state.values() if self.optimizer is not None else ()):
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    optim += v.element_size() * v.numel()
        return dict(params_bytes=params_bytes, grads_bytes=grads, optim_bytes=optim, bucket_bytes=self.buckets.nbytes())

    def wrap_module(self):
        return self.module

    def wrap_optimizer(self):
        return ZeroOptimizer(self)

    # -- inside -----------------------------------------------------------------

    def _grad_hook(self, i):
        def hook(*_):
            self._used_local[i] = True
            if self.queue is not None:
                self.queue.ready(i)
            elif self.z3 is not None:
                self.z3.grad_ready(i)
        return hook

    def _local_grad(self, i):
        g = self.params[i].grad
        return None if g is None else g.view(-1)

    def _piece_grad(self, pc):
        """A piece's averaged gradient: in its shard, or (range form, stage 1)
        in the owned elements of the parameter's whole gradient."""
        if pc.grad is not None:
            return pc.grad
        return self.params[pc.index].grad.view(-1)[pc.first:pc.first + pc.numel]

    def _shard_view(self, i):
        return self.group_of[i].shard_view(i, self.params[i].shape)

    def _gather_params(self):
        flat = lambda i: self.params[i].data.view(-1)  # noqa: E731
        for g in self.groups:
            self.buckets.all_gather(g, flat, flat)

    def _bucket_groups(self):
        """ZeRO-2's shard groups: the parameters in reverse order (about the
        order backward finishes them) cut into buckets.

        Whole form: buckets of about one window per rank plus one (owners
        are chosen over the whole model, so a rank's block of a bucket
        varies). Range form: buckets of at most N windows, so a bucket's N
        equal ranges are one window and one reduce-scatter (a parameter
        larger than that is a bucket of its own, in several windows)."""
        w, n = self.buckets.width, self.world
        if self.ranges:
            make = lambda idx: RangeGroup(idx, self.params, self.rank, n)  # noqa: E731
        else:
            make = lambda idx: ShardGroup(idx, self.params, self.rank, n, self.owner)  # noqa: E731
        groups, cur, size = [], [], 0
        for i in reversed(self.trainable):
            k = self.params[i].numel()
            if self.ranges and cur and size + k > w * n:
                groups.append(make(cur))
                cur, size = [], 0
            cur.append(i)
            size += k
            if size >= (w * n if self.ranges else w * (n + 1)):
                groups.append(make(cur))
                cur, size = [], 0
        if cur or not groups:
            groups.append(make(cur))
        return groups

    def _reduce_bucket(self, g):
        """ZeRO-2: a bucket whose gradients are all final starts towards its
        owners (added to their shards when after_backward waits for it) and
        the whole gradients are dropped (the reduce-scatter has a copy)."""
        self.buckets.reduce_scatter_start(g, self._local_grad, g.shard)
        for i in g.indices:
            self.params[i].grad = None

    def _exchange_used(self):
        """has_grad |= used on any rank (one small all-reduce per step, one
        float per trainable parameter)."""
        flags = torch.tensor([1.0 if (self._used_local[i] or self.has_grad[i]) else 0.0 for i in self.trainable],
                             dtype=torch.float32)
        if flags.numel():
            all_reduce_(flags, MAX)
        for i, f in zip(self.trainable, flags.tolist()):
            self.has_grad[i] = f > 0

    def _groups(self):
        return self.optimizer.param_groups if self.optimizer is not None else []

    def _fingerprint(self):
        return [(id(p), tuple(p.shape) if self.stage < 3 else None, p.requires_grad) for p in self.module.parameters()]

    def _shard_params(self, full):
        """What the optimizer holds of the parameter list full: the owned
        parameters (whole form) or the Parameters of the owned pieces."""
        if self.ranges:
            return [pc.param for p in full for pc in self._pieces_of[self.index[id(p)]]]
        return [p for p in full if self.index[id(p)] in self._owned_set]

    def _with_full_groups(self, fn):
        """Runs fn with the optimizer's groups holding every parameter again
        (as torch's state_dict/load_state_dict number them)."""
        for g, full in zip(self.optimizer.param_groups, self._full_groups):
            g["params"] = full
        try:
            return fn()
        finally:
            for g, full in zip(self.optimizer.param_groups, self._full_groups):
                g["params"] = self._shard_params(full)


class ZeroOptimizer(PreparedOptimizer):
    """The optimizer of an engine used without an Accelerator: a
    torch.optim.Optimizer sharing the script's param_groups and state
    (so torch's LR schedulers drive it) that steps and zeroes only when
    the engine syncs; its state_dict is the whole optimizer's."""

    def __init__(self, engine):
        super().__init__(engine.optimizer, engine, engine.accelerator)

    def _syncing(self):
        return self._engine._sync


def _is_f32(v):
    return isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() > 0


def _cut(piece, p, v):
    if isinstance(v, torch.Tensor) and v.dim() > 0 and tuple(v.shape) == tuple(p.shape):
        return piece.cut(v)
    return v.clone() if isinstance(v, torch.Tensor) else v
