"""Whole-parameter shards and the bucketed collectives that move them.

A shard group is a list of parameters split over the data-parallel ranks
by whole parameters: each parameter has one owner, chosen by the greedy
"largest first onto the least loaded rank" rule, which leaves every rank
with at most (group size / N + the largest parameter) elements. Rank k's
owned parameters, flattened and concatenated in group order, form its
block; every block is padded to the same length B (the largest load), so
the group as a whole is an N × B matrix and the two collectives of ZeRO
are the plain even ones:

    reduce_scatter: N × B (every rank's full gradients)  ->  B (my block, averaged)
    all_gather:     B (my block of parameters)           ->  N × B (everyone's)

Both run in windows of S columns (S = bucket elements / (N + 1)), so the
temporary buffers (N × S received, S sent) are one bucket whatever the
model size; a
parameter that straddles a window boundary is copied in pieces.

ZeRO-2 reduce-scatters from backward's hooks, and must not stop backward
while a window travels: reduce_scatter_start only starts each window's
reduce-scatter (the library runs it on its own thread) in a staging pair of
its own, and finish() waits for them before anything else communicates.
At most INFLIGHT windows travel at once (a further one first waits for
the oldest), so the staging is at most INFLIGHT buckets, and only while a
backward runs.

The collectives are the world group's C functions called on the tensors'
own memory (data_ptr), with no copy on the Python side.
"""

import collections
import ctypes
import pickle

import torch

from ._lib import check, lib

AVG = 1
MAX = 2
SUM = 0
_F32P = ctypes.POINTER(ctypes.c_float)


def _ptr(t):
    assert t.dtype == torch.float32 and t.is_contiguous()
    return ctypes.cast(t.data_ptr(), _F32P)


def reduce_scatter_(inp, out, op=AVG, dtype="fp32"):
    """out = this rank's block of the reduction of inp (N × len(out)).
    dtype is what the wire carries (ddp.reduce_dtype): "bf16" rounds inp to
    bfloat16, sums in float32 and rounds once, so out holds bfloat16
    values, for half the bytes."""
    if dtype == "fp32":
        check(lib.tinyacc_reduce_scatter(_ptr(inp), inp.numel(), _ptr(out), out.numel(), op))
    else:
        check(lib.tinyacc_reduce_scatter_as(_ptr(inp), inp.numel(), _ptr(out), out.numel(), op, dtype.encode()))


def reduce_scatter_start_(inp, out, op=AVG, dtype="fp32"):
    """Starts reduce_scatter_(inp, out, op, dtype) on the library's thread
    and returns its handle for wait_; inp and out must stay alive and
    unchanged until then."""
    h = ctypes.c_int64()
    if dtype == "fp32":
        check(lib.tinyacc_reduce_scatter_start(_ptr(inp), inp.numel(), _ptr(out), out.numel(), op, ctypes.byref(h)))
    else:
        check(lib.tinyacc_reduce_scatter_start_as(_ptr(inp), inp.numel(), _ptr(out), out.numel(), op,
                                                  dtype.encode(), ctypes.byref(h)))
    return h.value


def wait_(handle):
    """Blocks until the started collective handle has finished."""
    check(lib.tinyacc_collective_wait(handle))


def all_gather_(inp, out):
    """out = every rank's inp, concatenated in rank order."""
    check(lib.tinyacc_all_gather(_ptr(inp), inp.numel(), _ptr(out), out.numel()))


def all_reduce_(buf, op=SUM):
    """buf = the reduction of buf over the ranks, in place."""
    check(lib.tinyacc_all_reduce(_ptr(buf), buf.numel(), op))


def broadcast_(buf, src):
    check(lib.tinyacc_broadcast(_ptr(buf), buf.numel(), int(src)))


def balance(sizes, world):
    """Owner rank of each item: largest first, onto the least loaded rank
    (ties to the lower rank), so max load <= total / world + max(sizes)."""
    load = [0] * world
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(world), key=lambda k: (load[k], k))
        owner[i] = k
        load[k] += sizes[i]
    return owner


class ShardGroup:
    """Parameters (indices into the engine's list) sharded by owner.

    layout[k] is [(index, offset in rank k's block, numel)], block is B,
    shard is this rank's gradient block without its padding (allocated once).
    """

    def __init__(self, indices, params, rank, world, owner):
        """owner: rank of every parameter index (balance over the model's
        parameters, so that groups of a few parameters still spread)."""
        self.indices = list(indices)
        self.rank, self.world = rank, world
        sizes = [params[i].numel() for i in self.indices]
        self.owner = {i: owner[i] for i in self.indices}
        self.layout = [[] for _ in range(world)]
        fill = [0] * world
        for i, n in zip(self.indices, sizes):
            k = self.owner[i]
            self.layout[k].append((i, fill[k], n))
            fill[k] += n
        self.block = max(fill) if fill else 0
        self.fill = fill  # row k's columns [fill[k], block) are padding
        self.offset = {i: off for k in range(world) for i, off, _ in self.layout[k]}
        self.owned = [i for i, _, _ in self.layout[rank]]
        # Only the owned elements: the padding up to B exists in transit only.
        self.shard = torch.zeros(fill[rank])

    def shard_view(self, i, shape):
        """Parameter i's gradient inside this rank's shard (i must be owned)."""
        assert self.owner[i] == self.rank
        off = self.offset[i]
        return self.shard[off:off + shape.numel()].view(shape)

    def windows(self, width):
        a = 0
        while a < self.block:
            b = min(self.block, a + width)
            yield a, b
            a = b

    def pieces(self, k, a, b):
        """(index, lo, hi) of rank k's parameters overlapping block columns
        [a, b): elements [lo - off, hi - off) of parameter index."""
        for i, off, n in self.layout[k]:
            lo, hi = max(a, off), min(b, off + n)
            if lo < hi:
                yield i, off, lo, hi


class Buckets:
    """The one temporary buffer (N × S floats) the blocking windows go
    through, and the staging pairs of the started ones."""

    INFLIGHT = 4  # started windows travelling at once, at most

    def __init__(self, bucket_elems, world, reduce_dtype="fp32"):
        """reduce_dtype (ddp.reduce_dtype): the dtype the gradients'
        reduce-scatters carry, "fp32" or "bf16" (half the bytes; every
        averaged gradient is then a bfloat16 value)."""
        self.world = world
        self.reduce_dtype = reduce_dtype
        # N windows received plus one sent: one bucket in all.
        self.width = max(1, int(bucket_elems) // (world + 1))
        self.buf = None
        self.send = None
        # Started windows, oldest first: (handle, staging pair, into, a, e).
        self.pending = collections.deque()
        self.spare = []  # staging pairs of finished windows, until finish()

    def get(self, width):
        need = self.world * width
        if self.buf is None or self.buf.numel() < need:
            self.buf = torch.empty(need)
            self.send = torch.empty(width)
        return self.buf[:need], self.send[:width]

    def nbytes(self):
        return 0 if self.buf is None else 4 * (self.buf.numel() + self.send.numel())

    def reduce_scatter(self, group, grad_of, into, accumulate):
        """Averages every rank's gradients of group over the ranks into
        `into` (this rank's block): grad_of(i) is parameter i's flat local
        gradient or None (zeros). accumulate adds instead of overwriting.
        into=None: the averages overwrite this rank's own pieces of the
        local gradients (each piece is read into the window before it is
        written, and no later window reads it)."""
        for a, b in group.windows(self.width):
            w = b - a
            buf, out = self.get(w)
            self._fill(group, grad_of, a, b, buf)
            reduce_scatter_(buf, out, AVG, self.reduce_dtype)
            if into is None:
                for i, off, lo, hi in group.pieces(group.rank, a, b):
                    g = grad_of(i)
                    if g is not None:
                        g[lo - off:hi - off].copy_(out[lo - a:hi - a])
                continue
            e = min(b, into.numel())
            if a < e:
                if accumulate:
                    into[a:e].add_(out[:e - a])
                else:
                    into[a:e].copy_(out[:e - a])

    def reduce_scatter_start(self, group, grad_of, into):
        """reduce_scatter(group, grad_of, into, accumulate=True), started:
        each window's gradients are copied into a staging pair of its own
        (so the caller may drop them at once) and its reduce-scatter runs
        while the caller goes on; finish() adds the averages into `into`."""
        for a, b in group.windows(self.width):
            w = b - a
            if len(self.pending) >= self.INFLIGHT:
                self._finish_oldest()
            pair = self.spare.pop() if self.spare else (torch.empty(self.world * self.width), torch.empty(self.width))
            buf, out = pair[0][:self.world * w], pair[1][:w]
            self._fill(group, grad_of, a, b, buf)
            handle = reduce_scatter_start_(buf, out, AVG, self.reduce_dtype)
            self.pending.append((handle, pair, into, a, min(b, into.numel())))

    def finish(self):
        """Waits for every started window, oldest first, adds its averages
        into its shard, and drops the staging."""
        while self.pending:
            self._finish_oldest()
        self.spare = []

    def _finish_oldest(self):
        handle, pair, into, a, e = self.pending.popleft()
        wait_(handle)
        if a < e:
            into[a:e].add_(pair[1][:e - a])
        self.spare.append(pair)

    def _fill(self, group, grad_of, a, b, buf):
        """buf (N × (b - a)) = every rank's columns [a, b) of group: a
        gradient, or zeros for a missing gradient and for padding (every
        column written once, no zeroing of the whole buffer first)."""
        w = b - a
        for k in range(self.world):
            for i, off, lo, hi in group.pieces(k, a, b):
                g = grad_of(i)
                dst = buf[k * w + lo - a:k * w + hi - a]
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g[lo - off:hi - off])
            if group.fill[k] < b:
                buf[k * w + max(group.fill[k] - a, 0):(k + 1) * w].zero_()

    def all_gather(self, group, data_of, dest_of):
        """Every rank's owned parameters of group to the others: data_of(i)
        is owned parameter i's flat data; dest_of(i) the flat tensor that
        receives non-owned parameter i (None: not wanted)."""
        for a, b in group.windows(self.width):
            w = b - a
            buf, send = self.get(w)
            for i, off, lo, hi in group.pieces(group.rank, a, b):
                send[lo - a:hi - a].copy_(data_of(i)[lo - off:hi - off])
            if group.fill[group.rank] < b:
                send[max(group.fill[group.rank] - a, 0):].zero_()
            all_gather_(send, buf)
            for k in range(self.world):
                if k == group.rank:
                    continue
                for i, off, lo, hi in group.pieces(k, a, b):
                    d = dest_of(i)
                    if d is not None:
                        d[lo - off:hi - off].copy_(buf[k * w + lo - a:k * w + hi - a])


class InOrder:
    """Calls done(item) for items in one fixed order, each as soon as it
    and all before it are complete: item k is complete when every index
    of needs[k] has been reported ready (each index in at most one item).

    Every rank reduces its items in the same order whatever order its
    gradients arrive in, so the collectives pair up; an item whose
    gradients do not all arrive (a parameter unused in this backward)
    holds the later ones back until flush()."""

    def __init__(self, items, needs, done):
        self.items, self.needs, self.done = items, [list(n) for n in needs], done
        self.item_of = {i: k for k, n in enumerate(self.needs) for i in n}
        self._reset()

    def _reset(self):
        self.left = [len(n) for n in self.needs]
        self.next = 0

    def ready(self, i):
        k = self.item_of.get(i)
        if k is not None:
            self.left[k] -= 1
        while self.next < len(self.items) and self.left[self.next] <= 0:
            self.next += 1
            self.done(self.items[self.next - 1])

    def flush(self):
        while self.next < len(self.items):
            self.next += 1
            self.done(self.items[self.next - 1])
        self._reset()


def broadcast_object(obj, src, rank):
    """A picklable object from rank src to every rank: its bytes travel as
    one float32 per byte (exact), its length as three 16-bit digits."""
    data = pickle.dumps(obj) if rank == src else b""
    n = len(data)
    head = torch.tensor([n & 0xFFFF, (n >> 16) & 0xFFFF, n >> 32], dtype=torch.float32)
    broadcast_(head, src)
    h = [int(x) for x in head.tolist()]
    n = h[0] | (h[1] << 16) | (h[2] << 32)
    if rank == src:
        buf = torch.tensor(list(data), dtype=torch.float32)
    else:
        buf = torch.empty(n, dtype=torch.float32)
    if n:
        broadcast_(buf, src)
    return obj if rank == src else pickle.loads(bytes(buf.to(torch.uint8).tolist()))
