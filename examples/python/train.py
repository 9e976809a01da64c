"""A PyTorch-style training loop on tinyacc's engine.

    make python
    PYTHONPATH=python /usr/bin/python3 examples/python/train.py --config examples/demo.yaml
    build/tinyacc launch --nproc 2 -- /usr/bin/python3 examples/python/train.py

The config is resolved like `tinyacc train --config FILE` (defaults < file <
TINYACC_* variables), so both print the same losses. Under `tinyacc launch
--nproc N` the ranks train one model data-parallel (DDP, or ZeRO when
zero.stage is set): each rank reads train.batch_size sequences of every
micro-batch, its slice of a global batch N times as large, and the
gradients are averaged, so the losses printed are those of one process
with batch_size N times larger.
"""

import argparse
import time

from tinyacc import Accelerator
from tinyacc.data import TextDataLoader
from tinyacc.models import GPT, GPTConfig
from tinyacc.optim import AdamW


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="YAML config file (as for `tinyacc train --config`)")
    ap.add_argument("--quiet", action="store_true", help="print only the final line")
    args = ap.parse_args()

    accelerator = Accelerator(args.config)
    model = GPT(GPTConfig.from_config(accelerator.config))
    optimizer = AdamW(model.parameters())  # hyper-parameters from the config
    loader = TextDataLoader()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    start = time.perf_counter()
    steps = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = model(x, y)
            accelerator.backward(loss)
            if optimizer.step():  # true once grad_accum micro-batches are in
                m = optimizer.last_metrics
                steps += 1
                if not args.quiet:
                    accelerator.print("step %d loss %r lr %.6g" % (m["step"], m["loss"], m["lr"]))
            optimizer.zero_grad()
    elapsed = time.perf_counter() - start

    mean_loss = accelerator.reduce(optimizer.last_metrics["loss"], "mean").item()
    accelerator.wait_for_everyone()
    accelerator.print("trained %d steps on %d process(es) in %.3fs (%.2f ms/step); mean final loss %.4f"
                      % (steps, accelerator.num_processes, elapsed, 1000 * elapsed / max(1, steps), mean_loss))
    accelerator.end_training()


if __name__ == "__main__":
    main()
