"""ZeRO-3 for torch models: the parameters themselves are sharded.

The model is cut into units by the wrap policy (`zero.wrap`: module class
names, outermost match; default: each direct child of the root, the
children of a ModuleList or ModuleDict child in its place), plus one
unit for the parameters no such module holds (the root's own, and those
of modules outside every unit). Each unit's parameters form a shard group
(torch_zero_shard): every parameter is owned whole by one rank, which
alone keeps its data between uses; on the others its .data is an empty
tensor.

  forward   a unit's forward pre-hook all-gathers what it uses, its forward
            hook frees it again and puts a hook on each of its outputs: the
            gradient of an output arrives before the unit's own backward
            runs, and the hook all-gathers the unit once more. (Hooks rather
            than an identity autograd.Function, whose outputs would be views
            that in-place operations such as ReLU(inplace=True) refuse.)
  backward  when every trainable parameter of a unit has its gradient
            (the gradient accumulators' hooks tell), the unit's gradients
            are reduce-scattered into the owners' shards (summed over
            micro-batches), the whole gradients dropped and the parameters
            freed. Units are reduced in one fixed order (the reverse of the
            units' order, the root's unit last) so that every rank issues
            the same collectives in the same order: a unit that is not
            complete (a parameter unused in this backward) holds back the
            ones after it until after_backward flushes them.

torch.utils.checkpoint inside or around a unit runs the unit's forward
again during its backward: the pre-hook gathers the unit for it (if it was
freed) and, the unit's backward having begun, the forward hook leaves it
gathered; it is freed after, when its gradients are reduced.

Frozen parameters (requires_grad=False) are in no unit's group: every rank
keeps them whole, they are never gathered, freed or reduced, and a unit
made only of them communicates nothing.

A parameter shared by several units belongs to the first unit that holds
it; once gathered it stays gathered through the forward and until its
gradient is final (its accumulator runs once per backward, after every
user's contribution), which is when its own unit is reduced and freed.
"""

import torch

from .torch_zero_shard import InOrder, ShardGroup


class Unit:
    def __init__(self, name, module, uses):
        self.name, self.module, self.uses = name, module, uses
        self.group = None
        self.members = []
        # in_backward: the gradient of the unit's output has arrived and
        # its gradients are not reduced yet.
        self.in_backward = False


def _tensors(out):
    """The tensors in a module's output (tuples, lists, dicts nested)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    return []


class Stage3:
    def __init__(self, engine, wrap):
        self.e = engine
        params, index = engine.params, engine.index
        root = engine.module
        if isinstance(wrap, str) and not wrap.strip():
            wrap = None
        if wrap:
            if isinstance(wrap, str):  # "Block,Linear" as an environment variable gives it
                wrap = [w.strip() for w in wrap.split(",") if w.strip()]
            names = set(wrap)
            mods = []

            def walk(m, prefix):
                for n, c in m.named_children():
                    full = prefix + n
                    if type(c).__name__ in names:
                        mods.append((full, c))
                    else:
                        walk(c, full + ".")
            walk(root, "")
            if not mods:
                classes = sorted({type(m).__name__ for m in root.modules()} - {type(root).__name__})
                raise ValueError("tinyacc: zero.wrap=%s names no module class of the model below its root; its "
                                 "classes are %s" % (sorted(names), ", ".join(classes)))
        else:
            mods = []

            def children(m, prefix):
                # A ModuleList or ModuleDict has no forward of its own (its
                # hooks would never run): its children are the units.
                for n, c in m.named_children():
                    if isinstance(c, (torch.nn.ModuleList, torch.nn.ModuleDict)):
                        children(c, prefix + n + ".")
                    else:
                        mods.append((prefix + n, c))
            children(root, "")
        self.units = []
        inside = set()
        for name, m in mods:
            uses = []
            for p in m.parameters():
                if index[id(p)] not in uses:
                    uses.append(index[id(p)])
            self.units.append(Unit(name, m, uses))
            inside.update(id(s) for s in m.modules())
        rest = []
        for m in root.modules():
            if id(m) in inside:
                continue
            for p in m._parameters.values():
                if p is not None and index[id(p)] not in rest:
                    rest.append(index[id(p)])
        self.root_unit = Unit("<root>", root, rest) if rest else None
        if self.root_unit is not None:
            self.units.append(self.root_unit)
        # Owner unit: the first that uses a parameter; shared: used by more.
        users = {}
        for u in self.units:
            for i in u.uses:
                users.setdefault(i, []).append(u)
        self.shared = {i for i, us in users.items() if len(us) > 1}
        for i in engine.trainable:  # every one is in a module unit or the root's
            users[i][0].members.append(i)
        self.groups = []
        for u in self.units:
            u.group = ShardGroup(u.members, params, engine.rank, engine.world, engine.owner)
            self.groups.append(u.group)
        self.order = [u for u in reversed(self.units) if u is not self.root_unit]
        if self.root_unit is not None:
            self.order.append(self.root_unit)
        self.unit_of = {i: u for u in self.units for i in u.members}
        # full[i]: parameter i is whole on every rank now. It changes the
        # same way on all ranks (owners keep their data regardless), so
        # every rank decides the same gathers; a frozen one stays True.
        self.full = [True] * len(params)
        self.shapes = [p.shape for p in params]
        self.owner = {i: u.group.owner[i] for u in self.units for i in u.members}
        self.queue = InOrder(self.order, [u.members for u in self.order], self._reduce)
        self.free_all()
        for u in self.units:
            m = u.module
            m.register_forward_pre_hook(self._pre_hook(u))
            m.register_forward_hook(self._post_hook(u))

    # -- gathering and freeing ----------------------------------------------------

    def ensure(self, needed):
        """Gathers every parameter of needed that is not whole here (one
        all-gather per unit group that has one missing)."""
        missing = {}
        for i in needed:
            if not self.full[i]:
                missing.setdefault(self.unit_of[i], []).append(i)
        for u in self.units:
            if u in missing:
                self._gather(u.group, missing[u])

    def _gather(self, group, want):
        params = self.e.params
        dest = {i: torch.empty(self.shapes[i]).view(-1) for i in want if self.owner[i] != self.e.rank}
        self.e.buckets.all_gather(group, lambda i: params[i].data.view(-1), dest.get)
        for i in want:
            if i in dest:
                params[i].data = dest[i].view(self.shapes[i])
            self.full[i] = True

    def free(self, indices, keep_shared=False):
        params = self.e.params
        for i in indices:
            if self.full[i] and not (keep_shared and i in self.shared):
                if self.owner[i] != self.e.rank:
                    params[i].data = torch.empty(0)
                self.full[i] = False

    def free_all(self):
        self.free(self.e.trainable)

    def gather_whole(self):
        """Every parameter whole (a copy), on every rank: collective."""
        params = self.e.params
        out = {i: params[i].detach().clone() for i in range(len(params)) if i not in self.unit_of}
        for u in self.units:
            dest = {i: torch.empty(self.shapes[i]).view(-1) for i in u.members if self.owner[i] != self.e.rank}
            self.e.buckets.all_gather(u.group, lambda i: params[i].data.view(-1), dest.get)
            for i in u.members:
                out[i] = dest[i].view(self.shapes[i]) if i in dest else params[i].detach().clone()
        return out

    # -- hooks --------------------------------------------------------------------

    def _pre_hook(self, u):
        def hook(module, args):
            self.ensure(u.uses)
        return hook

    def _post_hook(self, u):
        def hook(module, args, out):
            if u.in_backward:
                # The unit's backward has begun: this forward is
                # torch.utils.checkpoint recomputing it. The pre-hook
                # gathered it (again, if it was freed); it stays gathered
                # for the backward that reads it and is freed, as always,
                # when its gradients are reduced.
                return
            self.free(u.members, keep_shared=True)
            if torch.is_grad_enabled():
                for t in _tensors(out):
                    if t.requires_grad and t.grad_fn is not None:
                        t.register_hook(self._regather(u))
        return hook

    def _regather(self, u):
        def hook(grad):
            u.in_backward = True
            self.ensure(u.uses)
        return hook

    def grad_ready(self, i):
        """A parameter's gradient is final for this backward."""
        self.queue.ready(i)

    def _reduce(self, u):
        params = self.e.params
        u.in_backward = False
        self.e.buckets.reduce_scatter(u.group, self.e._local_grad, u.group.shard, accumulate=True)
        for i in u.members:
            params[i].grad = None
        self.free(u.members)

    def flush(self):
        """After backward: reduce the units not reduced yet, free all."""
        self.queue.flush()
        for u in self.units:
            u.in_backward = False
        self.free_all()
