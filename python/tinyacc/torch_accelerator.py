"""The Accelerator's torch side: what prepare builds for torch objects and
the loop's calls on them (backward, no_sync, clipping, state, memory).

One engine per prepared module (torch_engine.TorchEngine): DDPEngine at
zero.stage 0, torch_zero.ZeroEngine at 1, 2 and 3 (units by zero.wrap).
Whatever the engine, prepare returns a PreparedModule and a
PreparedOptimizer (a torch.optim.Optimizer sharing the script's
param_groups and state, so torch's LR schedulers drive it) delegating to it. For a torch optimizer the engine
applies none of the run config's train.* optimizer keys (lr, schedule,
warmup_steps, weight_decay, grad_clip, beta1, beta2, eps, momentum): the
script's optimizer and its own clip_grad_norm_ calls rule.
"""

import contextlib
import json
import os

import torch

from . import distributed as dist
from .torch_prepare import (ActivationCounter, PreparedDataLoader, PreparedModule, PreparedOptimizer,
                            read_safetensors, unique_tensors, write_safetensors)


def prepare(acc, objects):
    if acc.mixed_precision == "fp16":
        raise ValueError("tinyacc: mixed_precision=\"fp16\" cannot run a torch model on the CPU: torch's CPU "
                         "autocast computes in bfloat16 only (torch.autocast(\"cpu\") takes dtype=torch.bfloat16); "
                         "use mixed_precision=\"bf16\", or \"fp16\" with the engine's GPT")
    if acc._session is not None:
        raise ValueError("tinyacc: this Accelerator already prepared a GPT; torch objects need an Accelerator of their own")
    if acc._torch is None:
        acc._torch = TorchState(acc)
        acc._interrupts.install()
    return acc._torch.prepare(objects)


def build_engine(acc, module, optimizer):
    """The engine zero.stage asks for."""
    stage = int(acc.config.zero.stage)
    if stage == 0:
        from .torch_ddp import DDPEngine
        return DDPEngine(acc, module, optimizer)
    try:
        from . import torch_zero
    except ImportError as e:
        raise NotImplementedError("tinyacc: zero.stage=%d for torch models needs tinyacc.torch_zero (%s); use zero.stage=0" % (stage, e)) from None
    return torch_zero.ZeroEngine(acc, module, optimizer, stage)


class TorchState:
    def __init__(self, acc):
        self.acc = acc
        self.engines = []   # (module, engine)
        self.loaders = []
        self.activations = ActivationCounter()
        acc._activations = self.activations

    # -- prepare ---------------------------------------------------------

    def prepare(self, objects):
        mods, opts = [], []
        for o in objects:
            if isinstance(o, (PreparedModule, PreparedOptimizer, PreparedDataLoader)):
                raise ValueError("tinyacc: %s was already prepared" % type(o).__name__)
            if isinstance(o, torch.nn.Module):
                mods.append(o)
            elif isinstance(o, torch.optim.Optimizer):
                opts.append(o)
            elif not isinstance(o, torch.utils.data.DataLoader):
                raise TypeError("tinyacc: prepare takes torch.nn.Module, torch.optim.Optimizer and torch.utils.data.DataLoader objects together, not %s"
                                % type(o).__name__)
        owner = {}
        for opt in opts:
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            found = [m for m in mods if ids <= {id(p) for p in m.parameters()}]
            if len(found) != 1:
                raise ValueError("tinyacc: prepare an optimizer together with the one model whose parameters it updates (found %d such models among the objects)" % len(found))
            if id(found[0]) in owner:
                raise ValueError("tinyacc: one model, one optimizer: two optimizers update the same model")
            owner[id(found[0])] = opt
        wrapped = {}
        for m in mods:
            opt = owner.get(id(m))
            eng = build_engine(self.acc, m, opt)
            self.engines.append((m, eng))
            for p in m.parameters():
                self.activations.param_ptrs.add(p.storage().data_ptr())
            wrapped[id(m)] = PreparedModule(m, eng, self.acc)
            if opt is not None:
                wrapped[id(opt)] = PreparedOptimizer(opt, eng, self.acc)
        out = []
        for o in objects:
            if isinstance(o, torch.utils.data.DataLoader):
                ld = PreparedDataLoader(o, self.acc)
                self.loaders.append(ld)
                out.append(ld)
            else:
                out.append(wrapped[id(o)])
        self.set_sync(self.acc._sync)
        return out

    def engine_of(self, model):
        m = model.module if isinstance(model, PreparedModule) else model
        for mod, eng in self.engines:
            if mod is m:
                return eng
        raise ValueError("tinyacc: %s is not a model this Accelerator prepared" % type(model).__name__)

    # -- the step --------------------------------------------------------

    def set_sync(self, sync):
        for _, e in self.engines:
            e.set_sync(sync)

    def backward(self, loss, **kwargs):
        for _, e in self.engines:
            e.before_backward()
        n = self.acc.gradient_accumulation_steps
        if n > 1:
            loss = loss / n
        loss.backward(**kwargs)
        for _, e in self.engines:
            e.after_backward()

    @contextlib.contextmanager
    def no_sync(self, model):
        eng = self.engine_of(model)
        eng.set_sync(False)
        try:
            yield
        finally:
            eng.set_sync(self.acc._sync)

    def _engine_of(self, parameters, what):
        """The prepared engine whose model holds every one of parameters,
        and those parameters as a list."""
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        params = list(parameters)
        ids = {id(p) for p in params}
        for mod, eng in self.engines:
            if ids <= {id(p) for p in mod.parameters()}:
                return eng, params
        raise ValueError(f"tinyacc: {what} takes parameters of one prepared model")

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        eng, params = self._engine_of(parameters, "clip_grad_norm_")
        return eng.clip_grad_norm_(params, max_norm, norm_type)

    def clip_grad_value_(self, parameters, clip_value):
        eng, params = self._engine_of(parameters, "clip_grad_value_")
        return eng.clip_grad_value_(params, clip_value)

    # -- state -------------------------------------------------------------

    def save_model(self, model, directory):
        eng = self.engine_of(model)
        sd = eng.full_state_dict()  # collective under ZeRO-3
        if self.acc.is_main_process:
            os.makedirs(directory, exist_ok=True)
            write_safetensors(os.path.join(directory, "model.safetensors"), unique_tensors(sd))
        dist.barrier()

    def state_dict(self, model):
        """The model's whole state dict under every name of its state_dict,
        as copies (collective under ZeRO-3)."""
        eng = self.engine_of(model)
        whole = eng.full_state_dict()
        return expand_shared(eng.module, {k: v.detach().clone() for k, v in whole.items()})

    def broadcast_path(self, path):
        """Rank 0's path (a string), on every rank."""
        if self.acc.num_processes == 1:
            return path
        from .torch_zero_shard import broadcast_object
        return broadcast_object(path, 0, self.acc.process_index)

    def save_state(self, directory, extra=None, save_extras=None):
        """directory/model.safetensors (model_1... for more models),
        optimizer.bin (torch.save of the optimizer's state dict, per model)
        and state.json (the loaders' positions, the accumulation counter,
        and extra); save_extras(directory) writes the rest before the
        ranks meet at the end."""
        main = self.acc.is_main_process
        if main:
            os.makedirs(directory, exist_ok=True)
        for k, (mod, eng) in enumerate(self.engines):
            sfx = "" if k == 0 else "_%d" % k
            sd = eng.full_state_dict()
            osd = eng.optimizer_state_dict()
            if main:
                write_safetensors(os.path.join(directory, "model%s.safetensors" % sfx), unique_tensors(sd))
                torch.save(osd, os.path.join(directory, "optimizer%s.bin" % sfx))
        if main:
            state = {"loaders": [ld.position() for ld in self.loaders], "accum_step": self.acc._accum_step}
            state.update(extra or {})
            with open(os.path.join(directory, "state.json.tmp"), "w") as f:
                json.dump(state, f)
            os.replace(os.path.join(directory, "state.json.tmp"), os.path.join(directory, "state.json"))
        if save_extras is not None:
            dist.barrier()  # the directory exists
            save_extras(directory)
        dist.barrier()

    def load_state(self, directory):
        for k, (mod, eng) in enumerate(self.engines):
            sfx = "" if k == 0 else "_%d" % k
            saved = read_safetensors(os.path.join(directory, "model%s.safetensors" % sfx))
            eng.load_model_state(expand_shared(mod, saved))
            eng.load_optimizer_state_dict(torch.load(os.path.join(directory, "optimizer%s.bin" % sfx)))
        with open(os.path.join(directory, "state.json")) as f:
            state = json.load(f)
        for ld, pos in zip(self.loaders, state["loaders"]):
            ld.restore(pos)
        self.acc._accum_step = int(state["accum_step"])
        return state

    def memory(self):
        out = dict(rank=self.acc.process_index, params_bytes=0, grads_bytes=0, optim_bytes=0, bucket_bytes=0)
        for _, e in self.engines:
            for k, v in e.memory().items():
                out[k] = out.get(k, 0) + int(v)
        out["total_bytes"] = out["params_bytes"] + out["grads_bytes"] + out["optim_bytes"] + out["bucket_bytes"]
        out["activations_peak_bytes"] = self.activations.peak
        out["rss_peak_bytes"] = rss_peak_bytes()
        return out

    def close(self):
        tr = self.acc.config.trace
        for _, e in self.engines:
            if tr and hasattr(e, "write_trace"):
                e.write_trace(rank_path(tr, self.acc.process_index))
            e.close()


def expand_shared(module, saved):
    """saved (a shared tensor once, under its first name) with every name of
    module's state_dict filled in from the entry sharing its memory."""
    # By identity, not memory: under ZeRO-3 a parameter this rank does not
    # own holds no memory between uses.
    own = module.state_dict(keep_vars=True)
    first = {}
    for k, t in own.items():
        first.setdefault(id(t), k)
    out = {}
    for k, t in own.items():
        src = k if k in saved else first[id(t)]
        if src not in saved:
            raise KeyError("tinyacc: the saved model has no tensor %r" % k)
        out[k] = saved[src]
    return out


def rank_path(path, rank):
    """trace.json -> trace.rank0.json, as the engine names per-rank traces."""
    base, ext = os.path.splitext(path)
    return "%s.rank%d%s" % (base, rank, ext or ".json")


def rss_peak_bytes():
    """The process's resident peak (VmHWM), 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def split_between_processes(acc, inputs, apply_padding=False):
    n, r = acc.num_processes, acc.process_index
    if isinstance(inputs, dict):
        with contextlib.ExitStack() as st:
            yield {k: st.enter_context(split_between_processes(acc, v, apply_padding)) for k, v in inputs.items()}
        return
    total = len(inputs)
    per, extra = divmod(total, n)
    start = r * per + min(r, extra)
    end = start + per + (1 if r < extra else 0)
    part = inputs[start:end]
    if apply_padding and extra and r >= extra and total:
        last = inputs[-1:]
        part = torch.cat([part, last]) if isinstance(part, torch.Tensor) else part + type(part)(last)
    yield part
