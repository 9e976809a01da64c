"""An Accelerate-style front end: the same training script runs as one
process or as N ranks under `tinyacc launch`."""

import contextlib
import json
import os

from . import distributed as dist
from .config import Config
from .data import TextDataLoader
from .models import GPT
from .optim import Optimizer
from .session import Loss, Session
from .tensor import Tensor


class Accelerator:
    """Holds the run configuration and this process's place in the world.

    config is a YAML/JSON file (resolved like `tinyacc train --config`:
    defaults < file < TINYACC_* environment), a dict, YAML text, a Config,
    or None for the defaults plus the environment.
    """

    def __init__(self, config=None, gradient_accumulation_steps=None):
        cfg = Config.coerce(config)
        if gradient_accumulation_steps is not None:
            cfg = cfg.with_overrides({"train": {"grad_accum": int(gradient_accumulation_steps)}})
        self.config = cfg
        self._rank, self._world = dist.init()
        self._session = None
        self._model = self._optimizer = self._loader = None

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
        """Whether the next optimizer.step() updates the weights."""
        if self._session is None:
            return True
        return self._session.state()[1] + 1 >= self._session.grad_accum

    def print(self, *args, **kwargs):
        """print() on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    # -- preparing -------------------------------------------------------------

    def prepare(self, *objects):
        """Joins a GPT, an optimizer and a TextDataLoader (any subset, any
        order, the model required) into one trainer session under this
        config; returns the objects in the order given."""
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

    def unwrap_model(self, model):
        return model

    # -- the step --------------------------------------------------------------

    def backward(self, loss):
        """Accumulates loss's gradients (scaled by 1/grad_accum)."""
        if not isinstance(loss, Loss):
            raise TypeError("tinyacc: backward needs the loss a model returned, not %s" % type(loss).__name__)
        loss.backward()

    @contextlib.contextmanager
    def accumulate(self, *models):
        """Gradient accumulation context. The session counts micro-batches
        itself (optimizer.step() updates every grad_accum backward passes),
        so the loop body needs nothing more."""
        yield

    @contextlib.contextmanager
    def no_sync(self, model):
        yield

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        """Clips the accumulated gradients to global norm max_norm and
        returns the norm before clipping (train.grad_clip also clips at
        every step)."""
        if norm_type != 2:
            raise ValueError("tinyacc: only the 2-norm is supported")
        return self._require_session().clip_grad_norm(max_norm)

    def evaluate(self):
        """Mean validation loss over train.eval_batches batches."""
        return self._require_session().evaluate()

    def _require_session(self):
        if self._session is None:
            raise RuntimeError("tinyacc: call accelerator.prepare(model, optimizer, loader) first")
        return self._session

    # -- collectives -----------------------------------------------------------

    def wait_for_everyone(self):
        dist.barrier()

    def gather(self, tensor):
        """tensor from every rank, concatenated along the first dimension."""
        return dist.all_gather(_as_tensor(tensor))

    def reduce(self, tensor, reduction="sum"):
        """The reduction ("sum", "mean", "max", "min") of tensor over ranks."""
        return dist.all_reduce(_as_tensor(tensor), reduction)

    # -- checkpoints -----------------------------------------------------------

    def save_state(self, output_dir):
        """Writes the whole training state (model weights, optimizer state
        with its step counts, the step) as a checkpoint under output_dir
        (output_dir/step-NNNNNNN and a latest pointer). Every rank must
        call it; each writes only the pieces it owns, and any number of
        ranks at any ZeRO stage can load it."""
        self._require_session().save_checkpoint(output_dir)

    def load_state(self, input_dir):
        """Restores what save_state wrote, whatever layout wrote it;
        training resumes at its step (the data loader continues from there
        too) with the optimizer exactly where it was."""
        step = self._require_session().load_checkpoint(input_dir)
        if self._loader is not None:
            self._loader.start_step = step

    def end_training(self):
        dist.finalize()


def _as_tensor(t):
    if isinstance(t, Loss):
        return Tensor([t.item()])
    if isinstance(t, (int, float)):
        return Tensor([float(t)])
    return Tensor.of(t, "float32")
