"""Optimizers. Hyper-parameters left as None come from the run config at
``Accelerator.prepare`` (or the model's config when used without one), so a
script and `tinyacc train` with the same config train the same way."""

import ctypes

from ._lib import Handle, check, encode, i64, lib
from .config import merge
from .session import Session


class Optimizer:
    """Base class: an optimizer over one model's parameters."""

    kind = None

    def __init__(self, params, **train_keys):
        params = list(params)
        if not params or not hasattr(params[0], "model"):
            raise ValueError("tinyacc: pass model.parameters() to the optimizer")
        self.model = params[0].model
        self._overrides = {"train": dict(train_keys, optimizer=self.kind)}
        self._handle = None
        self._session = None

    @property
    def handle(self):
        if self._handle is None:
            raise RuntimeError("tinyacc: the optimizer is not built yet; call accelerator.prepare or optimizer.step")
        return self._handle.handle

    def _build(self, config):
        """Creates the engine's optimizer from config (this optimizer's
        own settings already laid over it)."""
        h = i64()
        check(lib.tinyacc_optimizer_new(config.handle, self.model.handle, ctypes.byref(h)))
        self._handle = Handle(h.value)

    def _config_over(self, base):
        return base.with_overrides(self._overrides)

    def _ensure_session(self):
        """Without an Accelerator: a session of the model and this
        optimizer over the model's config."""
        if self._session is None:
            cfg = self._config_over(self.model._cfg)
            self._build(cfg)
            self._session = Session(cfg, self.model, self)
            self.model._session = self._session
        return self._session

    def step(self):
        """Optimizer step (after train.grad_accum backward passes; earlier
        calls only count). Returns whether the weights changed."""
        return self._ensure_session().step()

    def zero_grad(self, set_to_none=None):
        self._ensure_session().zero_grad()

    def save(self, path):
        check(lib.tinyacc_optimizer_save(self.handle, encode(str(path))))

    def load(self, path):
        check(lib.tinyacc_optimizer_load(self.handle, encode(str(path))))

    def free(self):
        if self._handle is not None:
            self._handle.free()

    @property
    def last_metrics(self):
        """The last step's metrics: loss, lr, grad_norm, tokens_per_s, ..."""
        return self._ensure_session().metrics()


class AdamW(Optimizer):
    """AdamW with decoupled weight decay on tensors of 2 or more dimensions
    (train.lr, train.beta1/beta2, train.eps, train.weight_decay)."""

    kind = "adamw"

    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None):
        b1, b2 = betas if betas is not None else (None, None)
        super().__init__(params, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay)


class SGD(Optimizer):
    """SGD with momentum (train.lr, train.momentum, train.weight_decay)."""

    kind = "sgd"

    def __init__(self, params, lr=None, momentum=None, weight_decay=None):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


__all__ = ["Optimizer", "AdamW", "SGD", "merge"]
