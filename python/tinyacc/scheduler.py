"""LR schedulers through Accelerator.prepare.

A scheduler is written for the single-process loop: one step() per
optimizer step. The prepared scheduler keeps that meaning whatever the
number of processes and the accumulation: its step() advances the
schedule once when the optimizer really stepped (the micro-batch syncs,
see Accelerator.sync_gradients) and does nothing on the others, so N ranks
see the learning rates one process sees step by step. (Accelerate's default
steps it num_processes times per optimizer step, for schedules written for
the number of per-process batches; tinyacc never does.) With
Accelerator(step_scheduler_with_optimizer=False) step() always advances it.
"""


class AcceleratedScheduler:
    """The script's scheduler, whose step() follows the optimizer steps that
    happened; everything else (get_last_lr, state_dict, load_state_dict,
    attributes) is the scheduler's own."""

    def __init__(self, scheduler, accelerator, step_with_optimizer=True):
        self.scheduler = scheduler
        self._accelerator = accelerator
        self._step_with_optimizer = step_with_optimizer

    def step(self, *args, **kwargs):
        if self._step_with_optimizer and not self._accelerator.sync_gradients:
            return
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, sd):
        self.scheduler.load_state_dict(sd)

    def __getattr__(self, name):
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self):
        return "Accelerated" + type(self.scheduler).__name__
