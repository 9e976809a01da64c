"""Element-range shards: the optimized form of torch_zero_shard's groups,
for the optimizers whose update is elementwise (torch.optim.SGD, Adam,
AdamW).

A range group lays its parameters out in one flat order (concatenated,
flattened) of T elements and pads it to N equal parts of B = ceil(T / N):
rank k owns elements [k·B, (k+1)·B). Seen as the N × B matrix of
torch_zero_shard, row k is rank k's range, so the same windowed
reduce-scatter and all-gather (Buckets) move it; only the pieces differ: a
parameter that crosses a range boundary is cut into pieces, one per owner.

Why this is exact for these optimizers: every quantity SGD (momentum,
nesterov, weight decay), Adam and AdamW (amsgrad, weight decay) keep or
compute is per element, from that element's parameter, gradient and state,
plus scalars shared by the whole group (lr, betas, eps, the step count).
So stepping each piece p[lo:hi] with gradient g[lo:hi] and state s[lo:hi]
computes exactly the elements [lo, hi) of the step on the whole parameter.
Only the clip norm couples elements; it sums Σ|g|^p over owned elements
(each element is owned once) and all-reduces.

Whole-parameter groups leave a rank up to one largest parameter over its
share T / N, and optimizer state and gradient shards pay that excess
(three times with Adam); a range group pays at most N - 1 elements of
padding, in transit only (the shard holds the owned elements).
"""

import torch

from .torch_zero_shard import ShardGroup

ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def elementwise(optimizer):
    """True when optimizer's step is elementwise (its class is exactly one
    of torch's SGD, Adam, AdamW: a subclass may override step)."""
    return optimizer is not None and type(optimizer) in ELEMENTWISE


class RangeGroup(ShardGroup):
    """Parameters (indices into the engine's list) sharded by element range.

    layout[k] is [(index, column in rank k's range, numel, first element
    of the parameter)]: one entry per piece. owned lists the parameters
    with at least one owned element; shard is this rank's gradient range
    without padding (allocated once)."""

    def __init__(self, indices, params, rank, world, shard=True):
        """shard=False: no gradient shard (the reduce-scatter writes into the
        owned pieces of the whole gradients instead)."""
        self.indices = list(indices)
        self.rank, self.world = rank, world
        sizes = [params[i].numel() for i in self.indices]
        total = sum(sizes)
        self.block = -(-total // world)
        self.layout = [[] for _ in range(world)]
        self.fill = [max(0, min(self.block, total - k * self.block)) for k in range(world)]
        start = 0
        for i, n in zip(self.indices, sizes):
            lo = start
            while lo < start + n:
                k = lo // self.block
                hi = min(start + n, (k + 1) * self.block)
                self.layout[k].append((i, lo - k * self.block, hi - lo, lo - start))
                lo = hi
            start += n
        self.owner = None
        self.owned = [i for i, _, _, _ in self.layout[rank]]
        self.shard = torch.zeros(self.fill[rank] if shard else 0)
        self.has_shard = shard

    def shard_view(self, i, shape):
        raise AssertionError("a range group holds pieces of parameters; use owned_pieces")

    def owned_pieces(self):
        """(index, first element, numel, gradient view in the shard, or None
        without one) of every piece this rank owns."""
        return [(i, first, n, self.shard[col:col + n] if self.has_shard else None)
                for i, col, n, first in self.layout[self.rank]]

    def pieces(self, k, a, b):
        """(index, off, lo, hi) of rank k's pieces overlapping columns
        [a, b): elements [lo - off, hi - off) of parameter index (as in
        ShardGroup, with off shifted by the piece's first element)."""
        for i, col, n, first in self.layout[k]:
            lo, hi = max(a, col), min(b, col + n)
            if lo < hi:
                yield i, col - first, lo, hi


class Piece:
    """An owned piece of parameter index: param is a torch Parameter over
    elements [first, first + numel) of the parameter's own memory (the
    optimizer steps it in place), grad its gradient in the shard (None:
    in the parameter's whole gradient)."""

    def __init__(self, index, param, first, numel, grad):
        self.index, self.first, self.numel, self.grad = index, first, numel, grad
        self.param = torch.nn.Parameter(param.data.view(-1)[first:first + numel], requires_grad=param.requires_grad)

    def cut(self, v):
        """The piece of a per-element tensor of the whole parameter's shape."""
        return v.detach().reshape(-1)[self.first:self.first + self.numel].clone()
