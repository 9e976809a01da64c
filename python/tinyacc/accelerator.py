"""An Accelerate-style front end: the same training script runs as one
process or as N ranks under `tinyacc launch`.

For torch scripts the names are Accelerate's, with its semantics: a script
that uses only those runs unchanged after `from tinyacc import Accelerator`
and `from tinyacc.utils import set_seed`. Where tinyacc differs (the
scheduler's steps, see scheduler.py; ZeRO-3's parameters between forward
passes, see get_state_dict), the method says so.
"""

import contextlib
import functools
import gc
import os
import sys

from . import distributed as dist
from .config import Config
from .data import TextDataLoader
from .models import GPT
from .optim import Optimizer
from .session import Loss, Session
from .tensor import Tensor
from .utils import AcceleratorState, DistributedType, ProjectConfiguration


class Accelerator:
    """Holds the run configuration and this process's place in the world.

    config is a YAML/JSON file (resolved like `tinyacc train --config`:
    defaults < file < TINYACC_* environment), a dict, YAML text, a Config,
    or None for the defaults plus the environment.

    Accelerate's arguments: gradient_accumulation_steps; mixed_precision
    (None: train.mixed_precision of the config; "no", "bf16" or "fp16": the
    engine's GPT runs its matrix products in that precision on float32
    master weights; a torch model's forward runs under
    torch.autocast("cpu", dtype=torch.bfloat16) with float32 parameters and
    gradients, and fp16 is refused for it, see prepare); project_dir or project_config
    (a tinyacc.utils.ProjectConfiguration): where save_state() without a
    directory writes (project_dir/checkpoints/checkpoint_<n>), where the
    trackers write, and what makes Ctrl-C and SIGTERM save before stopping
    (see interrupt.py); checkpoint_every: save_state() every that many
    optimizer steps; log_with ("tensorboard", "all", "jsonl" or a list);
    step_scheduler_with_optimizer (see scheduler.py). cpu,
    device_placement, kwargs_handlers and rng_types are accepted and change
    nothing (the engine runs on the CPU; every generator is saved).
    """

    def __init__(self, config=None, gradient_accumulation_steps=None, mixed_precision=None, project_dir=None,
                 project_config=None, checkpoint_every=None, log_with=None, step_scheduler_with_optimizer=True,
                 cpu=False, device_placement=True, kwargs_handlers=None, rng_types=None):
        cfg = Config.coerce(config)
        if gradient_accumulation_steps is not None:
            cfg = cfg.with_overrides({"train": {"grad_accum": int(gradient_accumulation_steps)}})
        if mixed_precision not in (None, "no", "bf16", "fp16"):
            raise ValueError("tinyacc: mixed_precision=%r is not supported: use \"no\", \"bf16\" or \"fp16\""
                             % (mixed_precision,))
        if mixed_precision is not None:
            cfg = cfg.with_overrides({"train": {"mixed_precision": mixed_precision}})
        self.config = cfg
        self._rank, self._world = dist.init(cfg)
        pc = project_config if project_config is not None else ProjectConfiguration()
        if project_dir is not None:
            pc.set_directories(project_dir)
        elif pc.logging_dir is None:
            pc.logging_dir = pc.project_dir
        if checkpoint_every is not None:
            pc.checkpoint_every = int(checkpoint_every)
        if pc.checkpoint_every is not None and (pc.checkpoint_every < 1 or pc.project_dir is None):
            raise ValueError("tinyacc: checkpoint_every=%r needs a positive number of optimizer steps and a "
                             "project_dir to save under" % (pc.checkpoint_every,))
        self.project_configuration = pc
        self.step_scheduler_with_optimizer = bool(step_scheduler_with_optimizer)
        self.log_with = [log_with] if isinstance(log_with, str) else list(log_with or [])
        self.trackers = []
        self._schedulers = []
        self._custom_objects = []
        self._optimizer_steps = 0   # optimizer steps that happened (syncing ones)
        self._trigger = False
        from .interrupt import Interrupts
        self._interrupts = Interrupts(self._rank)  # installed when torch objects are prepared
        self._session = None
        self._model = self._optimizer = self._loader = None
        # Accelerate's gradient state: sync_gradients is set when an
        # accumulate() block is entered and stays constant inside it.
        self._sync = True
        self._accum_step = 0
        self._end_of_dataloader = False
        self._last_loader = None
        self._torch = None  # torch_accelerator.TorchState once torch objects are prepared

    # -- where this process is -------------------------------------------------

    @property
    def process_index(self):
        return self._rank

    @property
    def local_process_index(self):
        return int(os.environ.get("LOCAL_RANK", self._rank))

    @property
    def num_processes(self):
        return self._world

    @property
    def is_main_process(self):
        return self._rank == 0

    @property
    def is_local_main_process(self):
        return self.local_process_index == 0

    @property
    def device(self):
        return self.config.device

    @property
    def gradient_accumulation_steps(self):
        return int(self.config.train.grad_accum)

    @property
    def sync_gradients(self):
        """Whether this micro-batch ends an accumulation: its gradients are
        communicated and optimizer.step() updates the weights. Set when an
        accumulate() block is entered (True on every grad_accum-th
        micro-batch and on the loader's last batch); True outside any."""
        return self._sync

    def _do_sync(self):
        """Accelerate's rule, applied on entering accumulate()."""
        if self._end_of_dataloader:
            self._accum_step = 0
            self._sync = True
        else:
            self._accum_step += 1
            self._sync = self._accum_step % max(1, self.gradient_accumulation_steps) == 0

    @property
    def is_last_process(self):
        return self._rank == self._world - 1

    @property
    def use_distributed(self):
        return self._world > 1

    @property
    def distributed_type(self):
        return DistributedType.MULTI_CPU if self._world > 1 else DistributedType.NO

    @property
    def mixed_precision(self):
        """train.mixed_precision: "no", "bf16" or "fp16"."""
        return str(self.config.train.mixed_precision)

    @property
    def state(self):
        """Accelerate's AcceleratorState: distributed_type, num_processes,
        process_index, local_process_index, device, mixed_precision, and
        zero_stage (tinyacc's)."""
        return AcceleratorState(self.distributed_type, self._world, self._rank, self.local_process_index,
                                self.device, self.mixed_precision, int(self.config.zero.stage))

    @property
    def project_dir(self):
        return self.project_configuration.project_dir

    @property
    def logging_dir(self):
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self):
        return self.project_configuration.iteration

    @property
    def optimizer_step_was_skipped(self):
        """Always False: without loss scaling no step is skipped."""
        return False

    def print(self, *args, **kwargs):
        """print() on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    # -- running on some processes only ----------------------------------------

    def on_process(self, function=None, process_index=None):
        """Decorator: the function runs on process process_index only (None
        elsewhere). Usable as @accelerator.on_process(process_index=1)."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only(function, lambda: self._rank == process_index)

    def on_local_process(self, function=None, local_process_index=None):
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only(function, lambda: self.local_process_index == local_process_index)

    def on_main_process(self, function):
        """Decorator: the function runs on the main process only."""
        return _only(function, lambda: self.is_main_process)

    def on_local_main_process(self, function):
        """Decorator: the function runs on each node's first process only."""
        return _only(function, lambda: self.is_local_main_process)

    def on_last_process(self, function):
        return _only(function, lambda: self.is_last_process)

    def unscale_gradients(self, optimizer=None):
        """Nothing to do: without loss scaling gradients are never scaled."""

    @contextlib.contextmanager
    def autocast(self, *args, **kwargs):
        """Under mixed_precision="bf16", torch.autocast("cpu",
        dtype=torch.bfloat16), which a prepared torch model's forward
        already runs in; otherwise nothing (the engine's GPT does its own
        mixed precision)."""
        if self.mixed_precision != "bf16":
            yield
            return
        import torch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield

    def save(self, obj, f, safe_serialization=False):
        """torch.save(obj, f) on the main process only."""
        if self.is_main_process:
            import torch
            torch.save(obj, f)

    # -- preparing -------------------------------------------------------------

    def prepare(self, *objects):
        """Joins a GPT, an optimizer and a TextDataLoader (any subset, any
        order, the model required) into one trainer session under this
        config; returns the objects in the order given.

        torch objects (torch.nn.Module, torch.optim.Optimizer,
        torch.utils.data.DataLoader, any mix and order) come back wrapped as
        objects of the same kinds, the model's distributed work done by the
        engine (see torch_accelerator)."""
        if any(_is_torch(o) or _is_scheduler(o) for o in objects):
            from . import torch_accelerator
            from .scheduler import AcceleratedScheduler
            rest = [o for o in objects if not _is_scheduler(o)]
            done = iter(torch_accelerator.prepare(self, rest) if rest else [])
            out = []
            for o in objects:
                if _is_scheduler(o):
                    o = AcceleratedScheduler(o, self, self.step_scheduler_with_optimizer)
                    self._schedulers.append(o)
                    out.append(o)
                else:
                    out.append(next(done))
            return out[0] if len(out) == 1 else tuple(out)
        models = [o for o in objects if isinstance(o, GPT)]
        opts = [o for o in objects if isinstance(o, Optimizer)]
        loaders = [o for o in objects if isinstance(o, TextDataLoader)]
        if len(models) != 1 or len(opts) > 1 or len(loaders) > 1:
            raise ValueError("tinyacc: prepare takes one GPT and at most one optimizer and one TextDataLoader")
        model = models[0]
        opt = opts[0] if opts else None
        loader = loaders[0] if loaders else None
        if opt is not None and opt.model is not model:
            raise ValueError("tinyacc: the optimizer was created for another model")
        # The run config, with what the objects fix themselves laid over it.
        cfg = self.config.with_overrides({"model": model.config.to_dict()})
        if opt is not None:
            cfg = opt._config_over(cfg)
        if loader is not None:
            cfg = loader._config_over(cfg)
            loader._build(cfg)
        if opt is not None:
            opt._build(cfg)
        self._session = Session(cfg, model, opt, loader)
        model._session = self._session
        if opt is not None:
            opt._session = self._session
        self._model, self._optimizer, self._loader = model, opt, loader
        self.config = cfg
        return objects[0] if len(objects) == 1 else objects

    def unwrap_model(self, model, keep_fp32_wrapper=True):
        """The script's own module behind a prepared one. Under ZeRO-3 a
        rank holds between forward passes only the parameters it owns; the
        others are empty tensors (shape (0,)) until the next forward gathers
        them: take weights through get_state_dict(model) or save_model, or
        read them inside `with accelerator.gathered_parameters(model):`."""
        return getattr(model, "module", model) if self._torch is not None else model

    def get_state_dict(self, model, unwrap=True):
        """The prepared torch model's whole state dict (every name of the
        module's state_dict, shared tensors under each of their names, as
        copies) at any zero.stage. Collective: every rank calls it; every
        rank gets it (Accelerate promises it on the main process)."""
        return self._require_torch("get_state_dict").state_dict(model)

    @contextlib.contextmanager
    def gathered_parameters(self, model):
        """Inside, every parameter of the prepared model is whole on every
        rank (ZeRO-3 gathers them; other stages hold them anyway); on exit
        ZeRO-3 frees what a rank does not own. Collective; for reading only:
        changes to parameters a rank does not own are dropped."""
        eng = self._require_torch("gathered_parameters").engine_of(model)
        z3 = getattr(eng, "z3", None)
        if z3 is None:
            yield
            return
        z3.ensure(range(len(eng.params)))
        try:
            yield
        finally:
            z3.free_all()

    # -- the step --------------------------------------------------------------

    def backward(self, loss, **kwargs):
        """Accumulates loss's gradients (scaled by 1/grad_accum)."""
        if self._torch is not None and not isinstance(loss, Loss):
            return self._torch.backward(loss, **kwargs)
        if not isinstance(loss, Loss):
            raise TypeError("tinyacc: backward needs the loss a model returned, not %s" % type(loss).__name__)
        loss.backward()

    @contextlib.contextmanager
    def accumulate(self, *models):
        """Gradient accumulation context: sets sync_gradients for this
        micro-batch (see there). For the engine's GPT the session counts
        micro-batches itself (optimizer.step() updates every grad_accum
        backward passes); a torch model's engine communicates nothing on a
        micro-batch that does not sync, and its prepared optimizer's step()
        and zero_grad() do nothing there."""
        self._do_sync()
        if self._torch is None:
            yield
            return
        self._torch.set_sync(self._sync)
        with contextlib.ExitStack() as stack:
            if not self._sync:
                for m in models:
                    stack.enter_context(self.no_sync(m))
            yield

    @contextlib.contextmanager
    def no_sync(self, model):
        """Gradients accumulate locally inside (torch models: no
        communication); the next syncing backward averages them all."""
        if self._torch is None:
            yield
            return
        with self._torch.no_sync(model):
            yield

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        """Clips the accumulated gradients to global norm max_norm and
        returns the norm before clipping (train.grad_clip also clips at
        every step)."""
        if self._torch is not None:
            return self._torch.clip_grad_norm_(parameters, max_norm, norm_type)
        if norm_type != 2:
            raise ValueError("tinyacc: only the 2-norm is supported")
        return self._require_session().clip_grad_norm(max_norm)

    def clip_grad_value_(self, parameters, clip_value):
        """Clamps the accumulated (averaged) gradients of a prepared torch
        model to [-clip_value, clip_value]."""
        return self._require_torch("clip_grad_value_").clip_grad_value_(parameters, clip_value)

    def evaluate(self):
        """Mean validation loss over train.eval_batches batches of the
        step's global size, which the ranks split as they split a training
        batch: every rank calls it, and all get the same value."""
        return self._require_session().evaluate()

    def _require_session(self):
        if self._session is None:
            raise RuntimeError("tinyacc: call accelerator.prepare(model, optimizer, loader) first")
        return self._session

    # -- collectives -----------------------------------------------------------

    def wait_for_everyone(self):
        dist.barrier()

    def gather(self, tensor):
        """tensor from every rank, concatenated along the first dimension
        (torch tensors: also each tensor of a list, tuple or dict)."""
        if _has_torch_tensor(tensor):
            from . import torch_prepare
            return _map_tensors(torch_prepare.all_gather, tensor)
        return dist.all_gather(_as_tensor(tensor))

    def gather_for_metrics(self, tensor):
        """gather, without the samples a prepared torch DataLoader repeated
        to pad its last batches (on its last batch)."""
        out = self.gather(tensor)
        ld = self._last_loader
        if self._end_of_dataloader and ld is not None and ld.remainder > 0:
            n = ld.remainder
            return _map_tensors(lambda t: t[:n], out) if _has_torch_tensor(out) else out[:n]
        return out

    def reduce(self, tensor, reduction="sum"):
        """The reduction ("sum", "mean", "max", "min") of tensor over ranks
        (torch tensors: also each tensor of a list, tuple or dict)."""
        if _has_torch_tensor(tensor):
            from . import torch_prepare
            op = dist._op(reduction)
            return _map_tensors(lambda t: torch_prepare.all_reduce(t, op), tensor)
        return dist.all_reduce(_as_tensor(tensor), reduction)

    def split_between_processes(self, inputs, apply_padding=False):
        """A context yielding this rank's contiguous share of inputs (a list,
        tuple, tensor or dict of them); the first len % N ranks get one more
        (apply_padding: the last element repeated so all get as many)."""
        from .torch_accelerator import split_between_processes
        return split_between_processes(self, inputs, apply_padding)

    def pad_across_processes(self, tensor, dim=0, pad_index=0, pad_first=False):
        """tensor padded with pad_index along dim to the largest size any
        rank has there (before the data when pad_first), so that gather can
        concatenate; lists, tuples and dicts of tensors are padded each.
        Collective."""
        from .torch_prepare import pad_across_processes
        return pad_across_processes(tensor, dim, pad_index, pad_first)

    def set_trigger(self):
        """Raises this rank's flag for check_trigger (e.g. to stop early)."""
        self._trigger = True

    def check_trigger(self):
        """Whether any rank called set_trigger since the last check that
        returned True (then the flags are lowered). Collective."""
        hit = self._any_rank(1.0 if self._trigger else 0.0) > 0
        if hit:
            self._trigger = False
        return hit

    def _any_rank(self, value):
        """The largest value over the ranks."""
        if self._world == 1:
            return value
        return float(dist.all_reduce([float(value)], "max").tolist()[0])

    @contextlib.contextmanager
    def local_main_process_first(self):
        """Each node's first process runs the block first, the others after."""
        if not self.is_local_main_process:
            self.wait_for_everyone()
        yield
        if self.is_local_main_process:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def main_process_first(self):
        """The main process runs the block first, the others after it."""
        if not self.is_main_process:
            self.wait_for_everyone()
        yield
        if self.is_main_process:
            self.wait_for_everyone()

    def save_model(self, model, save_directory, safe_serialization=True):
        """Writes the prepared torch model's weights (whole, under the
        module's own names, a shared tensor once under its first name) to
        save_directory/model.safetensors. Every rank must call it."""
        if self._torch is None:
            raise RuntimeError("tinyacc: save_model takes a prepared torch model; a GPT saves with model.save(path)")
        return self._torch.save_model(model, save_directory)

    def memory(self):
        """This rank's memory rows for a prepared torch model: params_bytes,
        grads_bytes, optim_bytes (what the engine registered or shards),
        activations_peak_bytes (saved tensors autograd kept, at their peak)
        and rss_peak_bytes (the process's resident peak)."""
        if self._torch is None:
            raise RuntimeError("tinyacc: memory() reports on prepared torch models")
        return self._torch.memory()

    # -- checkpoints -----------------------------------------------------------

    def register_for_checkpointing(self, *objects):
        """Objects with state_dict() and load_state_dict() that save_state
        and load_state keep too (custom_checkpoint_<k>.pkl, in this order)."""
        bad = [type(o).__name__ for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if bad:
            raise ValueError("tinyacc: register_for_checkpointing takes objects with state_dict() and "
                             "load_state_dict(); %s has not" % ", ".join(bad))
        self._custom_objects.extend(objects)

    def save_state(self, output_dir=None, **kwargs):
        """Writes the whole training state. Every rank must call it.

        torch objects: output_dir gets model.safetensors, optimizer.bin,
        scheduler.bin, custom_checkpoint_<k>.pkl, random_states_<rank>.pkl
        (Python's, NumPy's and torch's generators of each rank) and
        state.json (the loaders' positions, the accumulation counter, the
        optimizer steps); output_dir None writes
        project_dir/checkpoints/checkpoint_<iteration> (removing the oldest
        beyond total_limit). Returns the directory.

        A GPT: a checkpoint under output_dir (output_dir/step-NNNNNNN and
        a latest pointer) that any number of ranks at any ZeRO stage can
        load."""
        if self._torch is None:
            self._require_session().save_checkpoint(output_dir)
            return output_dir
        from . import checkpointing
        if output_dir is None:
            if self.project_dir is None:
                raise ValueError("tinyacc: save_state() without a directory needs Accelerator(project_dir=...)")
            output_dir = checkpointing.next_dir(self.project_configuration) if self.is_main_process else None
            self.project_configuration.iteration += 1
            output_dir = self._torch.broadcast_path(output_dir)
        self._torch.save_state(output_dir, {"optimizer_steps": self._optimizer_steps}, self._save_extras)
        return output_dir

    def _save_extras(self, directory):
        from . import checkpointing
        checkpointing.save_extras(directory, self._schedulers, self._custom_objects, self._rank, self.is_main_process)

    def load_state(self, input_dir=None, **kwargs):
        """Restores what save_state wrote, whatever layout wrote it;
        training resumes at its step (a prepared DataLoader continues where
        it was: skip_first_batches with the same count changes nothing) with
        the optimizer, schedulers, registered objects and random generators
        where they were. input_dir None: the newest
        project_dir/checkpoints/checkpoint_<n>."""
        if self._torch is None:
            step = self._require_session().load_checkpoint(input_dir)
            if self._loader is not None:
                self._loader.start_step = step
            return
        from . import checkpointing
        if input_dir is None:
            have = checkpointing.numbered(self.project_dir) if self.project_dir else []
            if not have:
                raise FileNotFoundError("tinyacc: load_state() found no checkpoint_<n> under %s"
                                        % os.path.join(str(self.project_dir), "checkpoints"))
            n, input_dir = have[-1]
            self.project_configuration.iteration = n + 1
        state = self._torch.load_state(input_dir)
        self._optimizer_steps = int(state.get("optimizer_steps", 0))
        self._saved_at = self._optimizer_steps  # checkpoint_every: this one exists
        checkpointing.load_extras(input_dir, self._schedulers, self._custom_objects, self._rank)

    def skip_first_batches(self, dataloader, num_batches=0):
        """The loader whose next pass starts at batch num_batches (of this
        rank's batches) of the current epoch, for resuming mid-epoch; later
        passes are whole. A prepared loader restored by load_state already
        starts where it was: skipping the same count again changes nothing."""
        from .torch_prepare import SkipFirstBatches
        return SkipFirstBatches(dataloader, int(num_batches))

    # -- the step boundary -----------------------------------------------------

    def _optimizer_stepped(self):
        self._optimizer_steps += 1

    def _step_boundary(self):
        """Called by a prepared DataLoader before the first micro-batch of
        an optimizer step: stops every rank here after a signal (see
        interrupt.py), and saves every checkpoint_every optimizer steps."""
        sig = int(self._any_rank(self._interrupts.signum))
        if sig:
            self._stop(sig)
        every = self.project_configuration.checkpoint_every
        if every and self._optimizer_steps and self._optimizer_steps % every == 0 \
                and self._optimizer_steps != getattr(self, "_saved_at", None):
            self._saved_at = self._optimizer_steps
            self.save_state()

    def _stop(self, sig):
        from .interrupt import NAMES
        where = None
        if self.project_dir is not None:
            where = self.save_state()
        msg = "tinyacc: rank %d stopped by %s after %d optimizer steps; " % (
            self._rank, NAMES.get(sig, "signal %d" % sig), self._optimizer_steps)
        msg += ("state saved to %s" % where) if where else "nothing saved (no Accelerator(project_dir=...))"
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
        self.end_training()
        raise SystemExit(128 + sig)

    # -- trackers --------------------------------------------------------------

    def init_trackers(self, project_name, config=None, init_kwargs=None):
        """On the main process: the metrics file (the config's metrics_file,
        else logging_dir/project_name/metrics.jsonl when a project or logging
        dir is set or log_with names "jsonl" or "all"), and TensorBoard's
        event files in logging_dir/project_name when log_with names
        "tensorboard" or "all" and torch.utils.tensorboard imports."""
        if not self.is_main_process:
            return
        from . import tracking
        base = os.path.join(self.logging_dir or ".", project_name)
        path = self.config.metrics_file
        if not path and (self.logging_dir or {"jsonl", "all"} & set(self.log_with)):
            path = os.path.join(base, "metrics.jsonl")
        if path:
            self.trackers.append(tracking.JSONLTracker(path, config))
        if {"tensorboard", "all"} & set(self.log_with):
            if tracking.tensorboard_available():
                self.trackers.append(tracking.TensorBoardTracker(base, config))
            else:
                sys.stderr.write("tinyacc: torch.utils.tensorboard does not import; logging to %s only\n" % path)

    def get_tracker(self, name, unwrap=False):
        for t in self.trackers:
            if t.name == name:
                return t.tracker if unwrap else t
        raise ValueError("tinyacc: no tracker %r (have %s)" % (name, [t.name for t in self.trackers]))

    def log(self, values, step=None, log_kwargs=None):
        """values (name -> number or tensor) at step to every tracker (main
        process only)."""
        for t in self.trackers:
            t.log(values, step)

    def end_training(self):
        """Flushes and closes the trackers, releases the engines, leaves the
        world group."""
        for t in self.trackers:
            t.finish()
        self.trackers = []
        if self._torch is not None:
            self._torch.close()
        self._interrupts.restore()
        dist.finalize()

    def free_memory(self, *objects):
        """Drops what this Accelerator holds for the prepared objects (their
        engines, schedulers, registered objects) and collects garbage;
        returns a None for each object given, as Accelerate does:
        `model, optimizer = accelerator.free_memory(model, optimizer)`."""
        if self._torch is not None:
            self._torch.close()
            self._torch = None
        self._schedulers, self._custom_objects = [], []
        self._activations = None
        self._last_loader = None
        gc.collect()
        return [None] * len(objects)

    clear = free_memory

    def _require_torch(self, what):
        if self._torch is None:
            raise RuntimeError("tinyacc: %s takes a prepared torch model" % what)
        return self._torch


def _has_torch_tensor(x):
    """Whether x is a torch tensor or a list, tuple or dict holding one."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_torch_tensor(v) for v in x)
    if isinstance(x, dict):
        return any(_has_torch_tensor(v) for v in x.values())
    return False


def _map_tensors(fn, x):
    """fn applied to every torch tensor in x (nested lists, tuples, dicts)."""
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(fn, v) for v in x)
    if isinstance(x, dict):
        return type(x)((k, _map_tensors(fn, v)) for k, v in x.items())
    return fn(x) if _has_torch_tensor(x) else x


def _only(function, here):
    @functools.wraps(function)
    def run(*args, **kwargs):
        if here():
            return function(*args, **kwargs)
    return run


def _is_scheduler(o):
    """Whether o is a torch LR scheduler (anything with step, state_dict and
    an optimizer), without importing torch."""
    torch = sys.modules.get("torch")
    if torch is None or isinstance(o, (torch.nn.Module, torch.optim.Optimizer)):
        return False
    return hasattr(o, "step") and hasattr(o, "state_dict") and isinstance(getattr(o, "optimizer", None), torch.optim.Optimizer)


def _is_torch(o):
    """Whether o is a torch object, without importing torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(o, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader))


def _as_tensor(t):
    if isinstance(t, Loss):
        return Tensor([t.item()])
    if isinstance(t, (int, float)):
        return Tensor([float(t)])
    return Tensor.of(t, "float32")
