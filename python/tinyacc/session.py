"""The trainer session behind a prepared model: forward, backward, step."""

import ctypes
import os

from ._lib import Handle, check, f64, i32, i64, lib
from .tensor import Tensor


class Loss:
    """The mean loss of a forward pass, kept for backward.

    ``item()`` (or ``float(loss)``) reads the value; ``backward()``
    accumulates gradients. Converts to lists and NumPy like a tensor.
    """

    __slots__ = ("_handle", "_value")

    def __init__(self, handle, value):
        self._handle = Handle(handle) if handle else None
        self._value = value

    def item(self):
        return self._value

    def __float__(self):
        return self._value

    def tolist(self):
        return self._value

    def numpy(self):
        return Tensor([self._value], shape=()).numpy()

    def __array__(self, dtype=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def detach(self):
        return Loss(0, self._value)

    def backward(self):
        if self._handle is None:
            raise RuntimeError("tinyacc: this loss was computed without a graph (no_grad or detach); it cannot be backpropagated")
        check(lib.tinyacc_backward(self._handle.handle))

    def free(self):
        """Releases the loss (and its graph, if never backpropagated)."""
        if self._handle is not None:
            self._handle.free()

    def __repr__(self):
        return "tinyacc.Loss(%.6f)" % self._value


class Session:
    """A prepared trainer: a model with optimizer and data (both optional)."""

    def __init__(self, config, model, optimizer=None, loader=None):
        h = i64()
        check(lib.tinyacc_prepare(config.handle, model.handle,
                                  optimizer.handle if optimizer is not None else 0,
                                  loader.handle if loader is not None else 0, ctypes.byref(h)))
        self._handle = Handle(h.value)
        self.config = config
        self.has_optimizer = optimizer is not None
        self.grad_accum = max(1, int(config.train.grad_accum))

    @property
    def handle(self):
        return self._handle.handle

    def free(self):
        self._handle.free()

    def forward(self, x, y, grad=True):
        x = Tensor.of(x, "int32")
        y = Tensor.of(y, "int32")
        if len(x.shape) == 1:
            B, T = 1, x.shape[0]
        elif len(x.shape) == 2:
            B, T = x.shape
        else:
            raise ValueError("tinyacc: inputs must be [batch, seq] tokens, got shape %s" % (x.shape,))
        if y.numel() != x.numel():
            raise ValueError("tinyacc: targets have %d tokens but inputs %d" % (y.numel(), x.numel()))
        value = f64()
        if not grad:
            check(lib.tinyacc_forward(self.handle, x.ptr, y.ptr, B, T, None, ctypes.byref(value)))
            return Loss(0, value.value)
        h = i64()
        check(lib.tinyacc_forward(self.handle, x.ptr, y.ptr, B, T, ctypes.byref(h), ctypes.byref(value)))
        return Loss(h.value, value.value)

    def step(self):
        """Steps once grad_accum backward passes are in; returns whether it did."""
        stepped = i32()
        check(lib.tinyacc_step(self.handle, ctypes.byref(stepped)))
        return bool(stepped.value)

    def zero_grad(self):
        check(lib.tinyacc_zero_grad(self.handle))

    def run_step(self):
        v = f64()
        check(lib.tinyacc_run_step(self.handle, ctypes.byref(v)))
        return v.value

    def train_step(self, x, y):
        x = Tensor.of(x, "int32")
        y = Tensor.of(y, "int32")
        if x.numel() != y.numel():
            raise ValueError("tinyacc: targets have %d tokens but inputs %d" % (y.numel(), x.numel()))
        v = f64()
        check(lib.tinyacc_train_step(self.handle, x.ptr, y.ptr, x.numel(), ctypes.byref(v)))
        return v.value

    def evaluate(self):
        v = f64()
        check(lib.tinyacc_evaluate(self.handle, ctypes.byref(v)))
        return v.value

    def clip_grad_norm(self, max_norm):
        v = f64()
        check(lib.tinyacc_clip_grad_norm(self.handle, float(max_norm), ctypes.byref(v)))
        return v.value

    METRICS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "mfu")

    def metrics(self):
        """The last optimizer step's metrics as a dict."""
        out = (ctypes.c_double * len(self.METRICS))()
        check(lib.tinyacc_metrics(self.handle, out, len(out)))
        m = dict(zip(self.METRICS, out))
        m["step"] = int(m["step"])
        return m

    def state(self):
        step, micro = i64(), i64()
        check(lib.tinyacc_session_state(self.handle, ctypes.byref(step), ctypes.byref(micro)))
        return step.value, micro.value

    def set_step(self, step):
        check(lib.tinyacc_set_step(self.handle, int(step)))

    def save_checkpoint(self, directory):
        """Writes the training state as directory/step-NNNNNNN (collective)."""
        check(lib.tinyacc_save_checkpoint(self.handle, os.fsencode(directory)))

    def load_checkpoint(self, directory):
        """Loads a checkpoint into this session's layout; returns its step."""
        step = i64()
        check(lib.tinyacc_load_checkpoint(self.handle, os.fsencode(directory), ctypes.byref(step)))
        return step.value
