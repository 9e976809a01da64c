"""Data loading over a text corpus, batch for batch what `tinyacc train` reads."""

import ctypes

from ._lib import Handle, check, i64, lib
from .config import Config
from .tensor import Tensor


class TextDataLoader:
    """Iterates (x, y) micro-batches of a byte-tokenised text corpus.

    path is a file or directory (None: the run config's data.path, whose
    default is the Go toolchain's own sources). Arguments left as None come
    from the run config at ``Accelerator.prepare``, or the defaults. One
    pass yields train.steps × train.grad_accum micro-batches of
    [batch_size, block_size] int32 tokens; y is x shifted by one token.
    """

    def __init__(self, path=None, batch_size=None, block_size=None, steps=None, order=None,
                 max_bytes=None, val_fraction=None, seed=None, config=None):
        self._overrides = {
            "data": {"path": path, "order": order, "max_bytes": max_bytes, "val_fraction": val_fraction},
            "train": {"batch_size": batch_size, "steps": steps, "seed": seed},
            "model": {"block_size": block_size},
        }
        self._base = config
        self._handle = None
        self._config = None
        self.start_step = 0

    @property
    def handle(self):
        return self._ensure().handle

    def _config_over(self, base):
        return base.with_overrides(self._overrides)

    def _build(self, config):
        h = i64()
        check(lib.tinyacc_loader_new(config.handle, ctypes.byref(h)))
        self._handle = Handle(h.value)
        self._config = config
        B, T, A = i64(), i64(), i64()
        check(lib.tinyacc_loader_info(h.value, ctypes.byref(B), ctypes.byref(T), ctypes.byref(A), None))
        self.batch_size, self.block_size, self.grad_accum = B.value, T.value, A.value
        self.steps = int(config.train.steps)

    def _ensure(self):
        if self._handle is None:
            self._build(self._config_over(Config.coerce(self._base) if self._base is not None else Config.from_text("")))
        return self._handle

    def batch(self, step, micro=0):
        """Micro-batch micro of optimizer step step, as (x, y) tensors."""
        h = self._ensure().handle
        shape = (self.batch_size, self.block_size)
        x, y = Tensor.empty(shape, "int32"), Tensor.empty(shape, "int32")
        check(lib.tinyacc_loader_batch(h, step, micro, x.ptr, y.ptr, x.numel()))
        return x, y

    def __iter__(self):
        self._ensure()
        for step in range(self.start_step, self.steps):
            for micro in range(self.grad_accum):
                yield self.batch(step, micro)

    def __len__(self):
        self._ensure()
        return (self.steps - self.start_step) * self.grad_accum

    def free(self):
        if self._handle is not None:
            self._handle.free()
