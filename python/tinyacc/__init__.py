"""tinyacc: train GPT models with tinyacc's engine from Python.

    from tinyacc import Accelerator
    from tinyacc.models import GPT, GPTConfig
    from tinyacc.optim import AdamW
    from tinyacc.data import TextDataLoader

    accelerator = Accelerator("config.yaml")
    model = GPT(GPTConfig.from_config(accelerator.config))
    optimizer = AdamW(model.parameters())
    loader = TextDataLoader()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = model(x, y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

The engine runs in libtinyacc.so (loaded with ctypes); errors it reports
raise TinyaccError with its message.
"""

import contextlib
import threading

from ._lib import ConfigError, HandleError, TinyaccError, lib

_state = threading.local()


def _grad_enabled():
    return getattr(_state, "grad", True)


@contextlib.contextmanager
def no_grad():
    """Forward passes inside build no graph (evaluation)."""
    prev = _grad_enabled()
    _state.grad = False
    try:
        yield
    finally:
        _state.grad = prev


def version():
    """The engine's release."""
    return lib.tinyacc_version().decode()


__version__ = version()

from .tensor import Tensor  # noqa: E402
from .config import Config  # noqa: E402
from .accelerator import Accelerator  # noqa: E402
from . import data, distributed, models, optim, utils  # noqa: E402
from .utils import set_seed  # noqa: E402

__all__ = ["Accelerator", "Config", "ConfigError", "HandleError", "Tensor", "TinyaccError",
           "data", "distributed", "models", "no_grad", "optim", "set_seed", "utils", "version"]
