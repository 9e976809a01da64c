"""Trackers behind Accelerator.init_trackers and Accelerator.log, on the
main process only.

JSONLTracker writes the engine's metrics_file format: one JSON object per
line, "kind" first ("train"), then "step" and the logged values (a tensor
as its number, NaN and infinities as null), so `tinyacc plot` draws a
script's log as it draws a `tinyacc train` run. TensorBoardTracker writes
TensorBoard's event files through torch.utils.tensorboard when it imports.
"""

import json
import math
import os


def _number(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


class JSONLTracker:
    name = "jsonl"

    def __init__(self, path, config=None):
        self.path = path
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        self.file = open(path, "w")
        if config:
            self._write({"kind": "config", "config": {k: _number(v) for k, v in dict(config).items()}})

    @property
    def tracker(self):
        return self.file

    def _write(self, row):
        self.file.write(json.dumps(row, separators=(",", ":"), default=str) + "\n")
        self.file.flush()

    def log(self, values, step=None):
        row = {"kind": "train"}
        if step is not None:
            row["step"] = int(step)
        for k, v in values.items():
            row[k] = _number(v)
        self._write(row)

    def finish(self):
        if not self.file.closed:
            self.file.close()


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, logdir, config=None):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(logdir)
        if config:
            self.writer.add_text("config", json.dumps(dict(config), default=str))

    @property
    def tracker(self):
        return self.writer

    def log(self, values, step=None):
        for k, v in values.items():
            v = _number(v)
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, global_step=step)
            elif isinstance(v, str):
                self.writer.add_text(k, v, global_step=step)
        self.writer.flush()

    def finish(self):
        self.writer.close()


def tensorboard_available():
    try:
        import torch.utils.tensorboard  # noqa: F401
    except Exception:
        return False
    return True
