"""Accelerate's helpers under their names (`from tinyacc.utils import
set_seed`), for the torch scripts the Accelerator runs."""

import dataclasses
import enum
import os
import random


def set_seed(seed, device_specific=False):
    """Seeds Python's random, NumPy (when installed) and torch (when
    imported) with seed, plus the process index when device_specific, so
    that every rank draws something else."""
    seed = int(seed)
    if device_specific:
        seed += int(os.environ.get("RANK", "0"))
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (1 << 32))
    except ImportError:
        pass
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return
    torch.manual_seed(seed)


class DistributedType(str, enum.Enum):
    """How the processes split the work, under Accelerate's names: NO for one
    process, MULTI_CPU for several (at any zero.stage: ZeRO is tinyacc's own,
    see AcceleratorState.zero_stage)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"


@dataclasses.dataclass
class ProjectConfiguration:
    """Accelerate's project settings: where save_state() without a directory
    writes (project_dir/checkpoints/checkpoint_<iteration> with
    automatic_checkpoint_naming, keeping the last total_limit), where trackers
    write (logging_dir, default project_dir). checkpoint_every (tinyacc's):
    save_state() every that many optimizer steps, at the step boundary; a
    project_dir also makes Ctrl-C and SIGTERM save before stopping."""

    project_dir: str = None
    logging_dir: str = None
    automatic_checkpoint_naming: bool = False
    total_limit: int = None
    iteration: int = 0
    save_on_each_node: bool = False
    checkpoint_every: int = None

    def set_directories(self, project_dir=None):
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir


@dataclasses.dataclass
class AcceleratorState:
    """What Accelerator.state reports about this process and the run."""

    distributed_type: DistributedType
    num_processes: int
    process_index: int
    local_process_index: int
    device: object
    mixed_precision: str
    zero_stage: int

    @property
    def is_main_process(self):
        return self.process_index == 0

    @property
    def is_local_main_process(self):
        return self.local_process_index == 0

    @property
    def is_last_process(self):
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self):
        return self.num_processes > 1
