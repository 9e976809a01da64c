"""Torch objects through ``Accelerator.prepare``: the wrappers a script
gets back (a module, an optimizer, a data loader of the same kinds) and the
collectives on torch tensors.

The prepared module and optimizer delegate everything distributed to the
model's engine (torch_engine.TorchEngine); the prepared loader shards the
original loader's batches over the data-parallel ranks as Accelerate does.
"""

import collections
import ctypes
import json
import math
import os
import struct

import torch
from torch.utils.data import DataLoader

from . import _lib
from ._lib import check, lib

_AVG, _SUM, _MAX = 1, 0, 2


# -- the model -------------------------------------------------------------


class PreparedModule(torch.nn.Module):
    """The script's module behind the engine. forward is the module's own
    (activations counted through saved-tensor hooks; under
    mixed_precision="bf16" inside torch.autocast("cpu", torch.bfloat16),
    with bfloat16 outputs returned as float32, as Accelerate does); its
    parameters, state_dict and attributes are the module's, under the
    module's names."""

    def __init__(self, module, engine, accelerator):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_accelerator", accelerator)

    def forward(self, *args, **kwargs):
        bf16 = self._accelerator.mixed_precision == "bf16"
        with torch.autograd.graph.saved_tensors_hooks(*self._accelerator._activations.hooks()):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = self.module(*args, **kwargs)
        return _to_float32(out) if bf16 else out

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, sd, strict=True):
        return self.module.load_state_dict(sd, strict)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)


def _to_float32(out):
    """out with its bfloat16 tensors (in tuples, lists and dicts too) as float32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == torch.bfloat16 else out
    if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
        return type(out)(_to_float32(o) for o in out)
    if isinstance(out, dict):
        return type(out)((k, _to_float32(v)) for k, v in out.items())
    return out


class ActivationCounter:
    """Bytes autograd keeps for backward (saved tensors that are not
    parameters), live and at their peak, through saved_tensors_hooks."""

    def __init__(self):
        self.live = 0
        self.peak = 0
        self.param_ptrs = set()

    class _Saved:
        __slots__ = ("t", "n", "owner")

        def __init__(self, t, n, owner):
            self.t, self.n, self.owner = t, n, owner

        def __del__(self):
            self.owner.live -= self.n

    def hooks(self):
        def pack(t):
            try:
                ptr = t.storage().data_ptr()
            except Exception:
                ptr = None
            if ptr in self.param_ptrs:
                return t
            n = t.numel() * t.element_size()
            self.live += n
            self.peak = max(self.peak, self.live)
            return ActivationCounter._Saved(t, n, self)

        def unpack(s):
            return s.t if isinstance(s, ActivationCounter._Saved) else s
        return pack, unpack


# -- the optimizer ---------------------------------------------------------


class PreparedOptimizer(torch.optim.Optimizer):
    """The script's optimizer; step and zero_grad go through the engine and
    do nothing on micro-batches that do not sync."""

    def __init__(self, optimizer, engine, accelerator):
        # No Optimizer.__init__: param_groups, state and defaults stay the
        # wrapped optimizer's own objects.
        self.optimizer = optimizer
        self._engine = engine
        self._accelerator = accelerator

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, v):
        self.optimizer.param_groups = v

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def _syncing(self):
        return self._accelerator.sync_gradients

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("tinyacc: optimizer.step(closure) is not supported on a prepared optimizer")
        if self._syncing():
            self._engine.step()
            stepped = getattr(self._accelerator, "_optimizer_stepped", None)
            if stepped is not None:
                stepped()

    def zero_grad(self, set_to_none=None):
        # Gradients live in the engine's memory: zeroed, never None.
        if self._syncing():
            self._engine.zero_grad()

    def state_dict(self):
        return self._engine.optimizer_state_dict()

    def load_state_dict(self, sd):
        self._engine.load_optimizer_state_dict(sd)

    def __repr__(self):
        return "Prepared" + repr(self.optimizer)


# -- data ------------------------------------------------------------------


class ShardedBatchSampler:
    """Batches of batch_size indices for one rank: micro-batch j of rank r
    is batch jN + r of the original order (N ranks), so the N ranks together
    read what one process reads with batch_size·N. The order is padded with
    samples from its start to a multiple of batch_size·N, so every rank has
    the same number of full batches (drop_last drops the partial global
    batch instead). With shuffle, every rank draws the same permutation from
    seed + epoch."""

    def __init__(self, n, batch_size, world, rank, shuffle, seed, drop_last):
        self.n, self.batch_size, self.world, self.rank = n, batch_size, world, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.skip = 0  # batches to skip at the start of the next pass (load_state)
        glob = batch_size * world
        if drop_last:
            self.padded, self.remainder = (n // glob) * glob, 0
        else:
            self.padded, self.remainder = math.ceil(n / glob) * glob, n % glob

    def order(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            idx = torch.randperm(self.n, generator=g).tolist()
        else:
            idx = list(range(self.n))
        if self.padded <= len(idx):
            return idx[:self.padded]
        return idx + [idx[i % self.n] for i in range(self.padded - self.n)]

    def __len__(self):
        return self.padded // (self.batch_size * self.world)

    def __iter__(self):
        idx = self.order()
        B, N = self.batch_size, self.world
        for j in range(self.skip, len(self)):
            k = j * N + self.rank
            yield idx[k * B:(k + 1) * B]
        self.skip = 0


class PreparedDataLoader(DataLoader):
    """The script's loader, sharded over the data-parallel ranks; batch_size
    stays per process. It tells the accelerator when it yields its last
    batch (sync_gradients and gather_for_metrics use it) and where it is
    (save_state)."""

    def __init__(self, loader, accelerator):
        if isinstance(loader.dataset, torch.utils.data.IterableDataset):
            raise TypeError("tinyacc: prepare takes DataLoaders over map-style datasets (with __len__); an IterableDataset cannot be sharded by index")
        if loader.batch_size is None:
            raise TypeError("tinyacc: prepare needs a DataLoader built with batch_size (not a custom batch_sampler)")
        shuffle = isinstance(loader.sampler, torch.utils.data.RandomSampler)
        sampler = ShardedBatchSampler(len(loader.dataset), loader.batch_size, accelerator.num_processes,
                                      accelerator.process_index, shuffle, int(accelerator.config.train.seed),
                                      loader.drop_last)
        # A generator of its own: starting a pass draws the workers' base
        # seed from it, not from torch's global generator, whose state
        # save_state keeps (a resumed run starts a pass where the first
        # did not).
        own = torch.Generator()
        own.manual_seed(int(accelerator.config.train.seed))
        super().__init__(loader.dataset, batch_sampler=sampler, num_workers=loader.num_workers,
                         collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                         timeout=loader.timeout, worker_init_fn=loader.worker_init_fn, generator=own)
        object.__setattr__(self, "batch_size", loader.batch_size)
        object.__setattr__(self, "_sharded", sampler)
        object.__setattr__(self, "_accelerator", accelerator)
        object.__setattr__(self, "_position", 0)

    @property
    def remainder(self):
        """Real samples in the last global batch (0: it is full)."""
        return self._sharded.remainder

    def set_epoch(self, epoch):
        self._sharded.epoch = epoch

    def __iter__(self):
        acc = self._accelerator
        n = len(self._sharded)
        j = self._sharded.skip
        it = super().__iter__()
        G = max(1, acc.gradient_accumulation_steps)
        for batch in it:
            if acc._accum_step % G == 0:
                acc._step_boundary()  # no micro-batch of a step pending
            j += 1
            object.__setattr__(self, "_position", j)
            acc._end_of_dataloader = j == n
            acc._last_loader = self
            yield batch
        acc._end_of_dataloader = False
        object.__setattr__(self, "_position", 0)
        self._sharded.epoch += 1

    def position(self):
        return dict(epoch=self._sharded.epoch, batch=self._position)

    def restore(self, pos):
        self._sharded.epoch = int(pos["epoch"])
        self._sharded.skip = int(pos["batch"])


class SkipFirstBatches:
    """Accelerator.skip_first_batches: the loader, whose next pass starts at
    batch n (a prepared loader skips them unread; any other iterable reads
    and drops them)."""

    def __init__(self, loader, n):
        self.loader, self.n = loader, n

    def __iter__(self):
        if isinstance(self.loader, PreparedDataLoader):
            self.loader._sharded.skip = self.n
            return iter(self.loader)
        import itertools
        return itertools.islice(iter(self.loader), self.n, None)

    def __len__(self):
        return max(0, len(self.loader) - self.n)

    def __getattr__(self, name):
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


# -- collectives on torch tensors -----------------------------------------


def pad_across_processes(t, dim=0, pad_index=0, pad_first=False):
    """Accelerator.pad_across_processes (see there)."""
    if isinstance(t, (list, tuple)):
        return type(t)(pad_across_processes(x, dim, pad_index, pad_first) for x in t)
    if isinstance(t, dict):
        return type(t)((k, pad_across_processes(v, dim, pad_index, pad_first)) for k, v in t.items())
    if not isinstance(t, torch.Tensor) or dim >= t.dim():
        return t
    n = t.shape[dim]
    biggest = int(all_reduce(torch.tensor([float(n)]), _MAX)[0])
    if biggest == n:
        return t
    shape = list(t.shape)
    shape[dim] = biggest
    out = t.new_full(shape, pad_index)
    at = [slice(None)] * t.dim()
    at[dim] = slice(biggest - n, biggest) if pad_first else slice(0, n)
    out[tuple(at)] = t
    return out



def _f32(t):
    return ctypes.cast(t.data_ptr(), _lib._f32p)


def all_gather(t):
    """Every rank's t (same shape) concatenated along dim 0, in rank order."""
    t = torch.as_tensor(t)
    src = t.detach().reshape(-1).to(torch.float32).contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    world = _world()
    out = torch.empty(world * src.numel(), dtype=torch.float32)
    check(lib.tinyacc_all_gather(_f32(src), src.numel(), _f32(out), out.numel()))
    return out.reshape((world * t.shape[0],) + tuple(t.shape[1:])).to(t.dtype)


def all_reduce(t, op):
    t = torch.as_tensor(t)
    buf = t.detach().to(torch.float32).contiguous().clone()
    check(lib.tinyacc_all_reduce(_f32(buf), buf.numel(), op))
    return buf.to(t.dtype) if t.is_floating_point() else buf


def _world():
    from . import distributed
    return distributed.world_size()


# -- model files -----------------------------------------------------------

_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}


def unique_tensors(sd):
    """sd without tensors that share memory with an earlier entry: a
    shared tensor once, under its first name."""
    out, seen = collections.OrderedDict(), set()
    for k, t in sd.items():
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        out[k] = t
    return out


def write_safetensors(path, sd):
    """Writes sd (name -> tensor) as one .safetensors file: a little-endian
    u64 header length, the JSON header, then the raw tensors in order."""
    header, blobs, off = {}, [], 0
    for k, t in sd.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[k] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """The tensors of a .safetensors file, name -> tensor, in file order."""
    import numpy as np
    inv = {v: k for k, v in _DTYPES.items()}
    np_of = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
             torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
             torch.uint8: np.uint8, torch.bool: np.bool_, torch.bfloat16: np.int16}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = collections.OrderedDict()
    for k, v in sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = inv[v["dtype"]]
        a, b = v["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=np_of[dt]).copy()
        t = torch.from_numpy(arr)
        if dt == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[k] = t.reshape(v["shape"])
    return out
