"""Collectives over the world group of the launcher's environment.

Under `tinyacc launch --nproc N` every process is a rank of the world;
started alone, a process is a world of one and every collective returns its
input. All functions take float32 tensors (or anything convertible: lists,
NumPy arrays) and return new Tensors; inputs are not modified.
"""

import ctypes

from ._lib import check, i64, lib
from .tensor import Tensor

SUM, AVG, MAX, MIN = 0, 1, 2, 3
_OPS = {"sum": SUM, "avg": AVG, "mean": AVG, "max": MAX, "min": MIN}


def _op(op):
    if isinstance(op, str):
        if op not in _OPS:
            raise ValueError("tinyacc: reduction %r is not one of %s" % (op, ", ".join(sorted(_OPS))))
        return _OPS[op]
    return int(op)


def init(config=None):
    """Joins the world group (once); returns (rank, world_size). With a
    Config, every collective and barrier of the group has its comm.timeout
    as deadline (else the TINYACC_* environment's); the first join decides."""
    r, s = i64(), i64()
    if config is not None:
        check(lib.tinyacc_dist_init_config(config.handle, ctypes.byref(r), ctypes.byref(s)))
    else:
        check(lib.tinyacc_dist_init(ctypes.byref(r), ctypes.byref(s)))
    return r.value, s.value


def rank():
    return init()[0]


def world_size():
    return init()[1]


def finalize():
    check(lib.tinyacc_dist_finalize())


def _copy(t):
    t = Tensor.of(t, "float32")
    return Tensor(t, shape=t.shape)


def all_reduce(t, op="sum"):
    """The elementwise reduction of t over all ranks."""
    out = _copy(t)
    check(lib.tinyacc_all_reduce(out.ptr, out.numel(), _op(op)))
    return out


def all_gather(t):
    """Every rank's t concatenated along the first dimension, in rank order."""
    t = Tensor.of(t, "float32")
    n = world_size()
    shape = (n * t.shape[0],) + tuple(t.shape[1:]) if t.shape else (n,)
    out = Tensor.empty(shape)
    check(lib.tinyacc_all_gather(t.ptr, t.numel(), out.ptr, out.numel()))
    return out


def reduce_scatter(t, op="sum"):
    """This rank's block of the reduction of t (its first dimension split
    evenly over the ranks)."""
    t = Tensor.of(t, "float32")
    n = world_size()
    if not t.shape or t.shape[0] % n:
        raise ValueError("tinyacc: reduce_scatter needs a first dimension divisible by the world size %d, got shape %s" % (n, t.shape))
    out = Tensor.empty((t.shape[0] // n,) + tuple(t.shape[1:]))
    check(lib.tinyacc_reduce_scatter(t.ptr, t.numel(), out.ptr, out.numel(), _op(op)))
    return out


def broadcast(t, src=0):
    """Rank src's t, on every rank."""
    out = _copy(t)
    check(lib.tinyacc_broadcast(out.ptr, out.numel(), int(src)))
    return out


def barrier():
    check(lib.tinyacc_barrier())


def sent_bytes():
    """The payload bytes this rank has sent since it joined the world group
    (every collective of the library counted, the prepared models' buckets
    and shards included), as the algorithms move them: at N ranks an
    all-gather of n bytes per rank sends (N-1)·n, a reduce-scatter of N·n
    bytes (N-1)·n, an all-reduce of n bytes 2(N-1)/N·n (ring) or (N-1)·n
    (direct). Hold a difference of two readings to a formula."""
    n = i64()
    check(lib.tinyacc_comm_sent_bytes(ctypes.byref(n)))
    return n.value
