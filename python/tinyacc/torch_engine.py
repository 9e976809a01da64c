"""The interface between a prepared torch model and the engine.

PyTorch computes forward and backward in the script's process; an engine
owns everything distributed about the model: where gradients live, how they
are averaged over the data-parallel ranks, how the optimizer steps, what a
checkpoint holds. ``Accelerator.prepare`` builds one engine per torch model
(torch_ddp.DDPEngine at zero.stage 0, torch_zero.ZeroEngine above) and the
prepared model and optimizer delegate to it.
"""

import abc


class TorchEngine(abc.ABC):
    """What every engine for a torch model implements.

    ``__init__(accelerator, module, optimizer)``: module is a
    ``torch.nn.Module`` of float32 contiguous CPU parameters; optimizer, a
    ``torch.optim.Optimizer`` over (some of) its parameters, may be None.
    The engine reads ``accelerator.config`` (ddp.*, zero.*, comm.timeout,
    trace) and ``accelerator.num_processes``.

    ``set_sync(sync)``: called when an ``accumulate()`` block is entered,
    with ``accelerator.sync_gradients``: whether this micro-batch ends an
    accumulation (its gradients are communicated and the optimizer steps).

    ``before_backward()``: called by ``accelerator.backward`` just before
    ``loss.backward()``; checks that the model is still the one prepared.

    ``after_backward()``: called by ``accelerator.backward`` after
    ``loss.backward()`` returned; when syncing, every gradient
    communication of this micro-batch has finished when it returns, and
    every ``.grad`` holds the average over the ranks.

    ``step()``: the prepared optimizer's step (only called when syncing).

    ``zero_grad()``: zeroes the gradients in place, never sets them None.

    ``clip_grad_norm_(parameters, max_norm, norm_type=2.0)``: clips to the
    global gradient norm (over every rank's part of the gradient) and
    returns the norm before clipping as a tensor, as
    ``torch.nn.utils.clip_grad_norm_`` does.

    ``clip_grad_value_(parameters, clip_value)``: clamps the averaged
    gradients to [-clip_value, clip_value], as
    ``torch.nn.utils.clip_grad_value_`` does.

    ``full_state_dict()``: an OrderedDict name -> tensor with every
    parameter whole (collective: every rank calls it).

    ``optimizer_state_dict()`` / ``load_optimizer_state_dict(sd)``: the
    optimizer's state as this engine saves and restores it. save_state
    calls optimizer_state_dict on every rank (it may be collective) and
    writes rank 0's result; load_state gives that to every rank.

    ``load_model_state(sd)``: copies the tensors of sd (module names) into
    the parameters.

    Optional: ``write_trace(path)`` (this rank's trace, when the config's
    ``trace`` is set) and ``close()`` (release what was registered), both
    called by ``end_training``.

    ``memory()``: this rank's bytes, ``dict(params_bytes=..., grads_bytes=...,
    optim_bytes=...)``, from what the engine registered or shards.
    """

    def __init__(self, accelerator, module, optimizer):
        self.accelerator = accelerator
        self.module = module
        self.optimizer = optimizer

    def set_sync(self, sync):
        self.sync = bool(sync)

    def before_backward(self):
        pass

    @abc.abstractmethod
    def after_backward(self):
        ...

    @abc.abstractmethod
    def step(self):
        ...

    @abc.abstractmethod
    def zero_grad(self):
        ...

    @abc.abstractmethod
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        ...

    @abc.abstractmethod
    def full_state_dict(self):
        ...

    @abc.abstractmethod
    def optimizer_state_dict(self):
        ...

    @abc.abstractmethod
    def load_optimizer_state_dict(self, sd):
        ...

    @abc.abstractmethod
    def load_model_state(self, sd):
        ...

    @abc.abstractmethod
    def memory(self):
        ...

    def close(self):
        """Releases what the engine registered with the library."""


def check_parameters(module):
    """The (name, parameter) pairs of module, each parameter once under its
    first name, refusing what the engine cannot hold yet: anything but
    float32 contiguous CPU tensors."""
    out = []
    for name, p in module.named_parameters():
        if p.dtype != _float32():
            raise TypeError("tinyacc: parameter %r is %s; only float32 parameters are supported (call model.float() before prepare)"
                            % (name, str(p.dtype).replace("torch.", "")))
        if p.device.type != "cpu":
            raise TypeError("tinyacc: parameter %r is on %s; only CPU parameters are supported" % (name, p.device))
        if not p.is_contiguous():
            raise TypeError("tinyacc: parameter %r is not contiguous (strides %s for shape %s); make it contiguous before prepare"
                            % (name, tuple(p.stride()), tuple(p.shape)))
        out.append((name, p))
    return out


def _float32():
    import torch
    return torch.float32


def parse_duration(s):
    """Seconds in a Go duration such as "5m0s", "30s", "1h2m", "250ms"."""
    import re
    if isinstance(s, (int, float)):
        return float(s)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    total, pos = 0.0, 0
    for m in re.finditer(r"([0-9.]+)(ms|us|µs|ns|h|m|s)", s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError("tinyacc: %r is not a duration such as 30s or 5m" % s)
    return total
