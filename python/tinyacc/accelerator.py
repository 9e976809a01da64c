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
        self._rank, self._world = dist.init(cfg)
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

    def print(self, *args, **kwargs):
        """print() on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    # -- preparing -------------------------------------------------------------

    def prepare(self, *objects):
        """Joins a GPT, an optimizer and a TextDataLoader (any subset, any
        order, the model required) into one trainer session under this
        config; returns the objects in the order given.

        torch objects (torch.nn.Module, torch.optim.Optimizer,
        torch.utils.data.DataLoader, any mix and order) come back wrapped as
        objects of the same kinds, the model's distributed work done by the
        engine (see torch_accelerator)."""
        if any(_is_torch(o) for o in objects):
            from . import torch_accelerator
            out = torch_accelerator.prepare(self, objects)
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

    def unwrap_model(self, model):
        return getattr(model, "module", model) if self._torch is not None else model

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
        """tensor from every rank, concatenated along the first dimension."""
        if _is_torch(tensor):
            from . import torch_prepare
            return torch_prepare.all_gather(tensor)
        return dist.all_gather(_as_tensor(tensor))

    def gather_for_metrics(self, tensor):
        """gather, without the samples a prepared torch DataLoader repeated
        to pad its last batches (on its last batch)."""
        out = self.gather(tensor)
        ld = self._last_loader
        if self._end_of_dataloader and ld is not None and ld.remainder > 0:
            return out[:ld.remainder]
        return out

    def reduce(self, tensor, reduction="sum"):
        """The reduction ("sum", "mean", "max", "min") of tensor over ranks."""
        if _is_torch(tensor):
            from . import torch_prepare
            return torch_prepare.all_reduce(tensor, dist._op(reduction))
        return dist.all_reduce(_as_tensor(tensor), reduction)

    def split_between_processes(self, inputs, apply_padding=False):
        """A context yielding this rank's contiguous share of inputs (a list,
        tuple, tensor or dict of them); the first len % N ranks get one more
        (apply_padding: the last element repeated so all get as many)."""
        from .torch_accelerator import split_between_processes
        return split_between_processes(self, inputs, apply_padding)

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

    def save_state(self, output_dir):
        """Writes the whole training state (model weights, optimizer state
        with its step counts, the step) as a checkpoint under output_dir
        (output_dir/step-NNNNNNN and a latest pointer). Every rank must
        call it; each writes only the pieces it owns, and any number of
        ranks at any ZeRO stage can load it."""
        if self._torch is not None:
            return self._torch.save_state(output_dir)
        self._require_session().save_checkpoint(output_dir)

    def load_state(self, input_dir):
        """Restores what save_state wrote, whatever layout wrote it;
        training resumes at its step (the data loader continues from there
        too) with the optimizer exactly where it was."""
        if self._torch is not None:
            return self._torch.load_state(input_dir)
        step = self._require_session().load_checkpoint(input_dir)
        if self._loader is not None:
            self._loader.start_step = step

    def end_training(self):
        if self._torch is not None:
            self._torch.close()
        dist.finalize()


def _is_torch(o):
    """Whether o is a torch object, without importing torch."""
    import sys
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
