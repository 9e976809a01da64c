"""What save_state writes for a torch script beside the model, optimizer
and data position (torch_accelerator), under Accelerate's file names:
scheduler.bin (scheduler_1.bin, ... for more) and custom_checkpoint_0.pkl,
... (objects given to register_for_checkpointing) from the main process,
random_states_<rank>.pkl (Python's, NumPy's and torch's generators) from
every rank; and where save_state() without a directory writes:
<project_dir>/checkpoints/checkpoint_<iteration>."""

import os
import random
import re
import shutil

import torch


def _np():
    try:
        import numpy as np
        return np
    except ImportError:
        return None


def rng_state():
    st = {"random_state": random.getstate(), "torch_manual_seed": torch.get_rng_state()}
    np = _np()
    if np is not None:
        st["numpy_random_seed"] = np.random.get_state()
    return st


def set_rng_state(st):
    random.setstate(st["random_state"])
    torch.set_rng_state(st["torch_manual_seed"])
    np = _np()
    if np is not None and "numpy_random_seed" in st:
        np.random.set_state(st["numpy_random_seed"])


def _suffix(k):
    return "" if k == 0 else "_%d" % k


def save_extras(directory, schedulers, objects, rank, main):
    if main:
        for k, s in enumerate(schedulers):
            torch.save(s.state_dict(), os.path.join(directory, "scheduler%s.bin" % _suffix(k)))
        for k, o in enumerate(objects):
            torch.save(o.state_dict(), os.path.join(directory, "custom_checkpoint_%d.pkl" % k))
    torch.save(rng_state(), os.path.join(directory, "random_states_%d.pkl" % rank))


def load_extras(directory, schedulers, objects, rank):
    for k, s in enumerate(schedulers):
        s.load_state_dict(torch.load(os.path.join(directory, "scheduler%s.bin" % _suffix(k)), weights_only=False))
    for k, o in enumerate(objects):
        o.load_state_dict(torch.load(os.path.join(directory, "custom_checkpoint_%d.pkl" % k), weights_only=False))
    path = os.path.join(directory, "random_states_%d.pkl" % rank)
    if os.path.exists(path):  # a rank the saving run did not have keeps its own
        set_rng_state(torch.load(path, weights_only=False))


_CHECKPOINT = re.compile(r"^checkpoint_(\d+)$")


def numbered(project_dir):
    """The checkpoint_<n> folders under project_dir/checkpoints, (n, path)
    in increasing n."""
    root = os.path.join(project_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _CHECKPOINT.match(name)
        if m:
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def next_dir(project_config):
    """The folder save_state() without a directory writes, after removing
    the oldest ones beyond total_limit (main process only)."""
    pc = project_config
    have = numbered(pc.project_dir)
    if pc.total_limit is not None and len(have) + 1 > pc.total_limit:
        for _, path in have[:len(have) + 1 - pc.total_limit]:
            shutil.rmtree(path, ignore_errors=True)
    return os.path.join(pc.project_dir, "checkpoints", "checkpoint_%d" % pc.iteration)
