"""A training script written the way Accelerate's users write them, using
only Accelerate's names (the import lines aside), for the parity tests.

    accelerate_script.py OUT_DIR [--save-at K] [--resume] [--signal-at K]
                          [--raise SIG] [--checkpoint-every N]

A character-level model with an embedding, a GRU (whose flat weights are
parameter references of its own) and a head; AdamW with a warmup LambdaLR;
gradient accumulation 2; a shuffled DataLoader whose batch size is the
global batch split over the processes. Writes OUT_DIR/result.json (main
process): the loss of every optimizer step (mean over the processes), the
learning rates, the step's saved checkpoint, the final state dict
(get_state_dict) and what the other names returned.

--save-at K: save_state() after optimizer step K (into the project's
checkpoints/checkpoint_<n>). --resume: load_state() the newest one and skip
the batches already done with skip_first_batches. --signal-at K: after step
K the main process sends SIGINT to its parent (the launcher) and waits until
the launcher's forwarded SIGINT reached it. --raise SIG: after step K every
rank (--raise-rank R: rank R only) sends SIG to itself (as if the launcher
had forwarded it).
"""

import argparse
import json
import os
import signal
import sys

import torch
import torch.nn.functional as F

from tinyacc import Accelerator
from tinyacc.utils import DistributedType, ProjectConfiguration, set_seed

GLOBAL_BATCH, STEPS, ACCUM, VOCAB, SEQ = 8, 6, 2, 12, 6


class CharModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.rnn = torch.nn.GRU(8, 8, batch_first=True)
        self.head = torch.nn.Linear(8, VOCAB)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


class Progress:
    """How far training got, kept by save_state through register_for_checkpointing."""

    def __init__(self):
        self.step, self.epoch, self.batch = 0, 0, 0

    def state_dict(self):
        return {"step": self.step, "epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, sd):
        self.step, self.epoch, self.batch = sd["step"], sd["epoch"], sd["batch"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--save-at", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--signal-at", type=int, default=0)
    ap.add_argument("--raise", dest="raise_sig", default="")
    ap.add_argument("--raise-rank", type=int, default=None)
    ap.add_argument("--checkpoint-every", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    set_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=ACCUM, mixed_precision="no",
                              project_config=ProjectConfiguration(project_dir=os.path.join(args.out, "project"),
                                                                  automatic_checkpoint_naming=True),
                              checkpoint_every=args.checkpoint_every, log_with="jsonl")
    accelerator.init_trackers("charlm", config={"global_batch": GLOBAL_BATCH, "accum": ACCUM})
    n = accelerator.num_processes

    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, VOCAB, (GLOBAL_BATCH * ACCUM * 4, SEQ + 1), generator=g)
    dataset = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = torch.utils.data.DataLoader(dataset, batch_size=GLOBAL_BATCH // n, shuffle=True)
    model = CharModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 8))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    if args.resume:
        accelerator.load_state()
    losses, lrs, saved, draws = {}, {}, {}, {}
    pending = []
    first_epoch = progress.epoch
    for epoch in range(first_epoch, 100):
        if progress.step >= STEPS:
            break
        batches = loader
        if args.resume and epoch == first_epoch:
            batches = accelerator.skip_first_batches(loader, progress.batch)
        progress.epoch = epoch
        for x, y in batches:
            with accelerator.accumulate(model):
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
                accelerator.backward(loss)
                pending.append(accelerator.reduce(loss.detach(), "mean"))
                if accelerator.sync_gradients:
                    accelerator.clip_grad_value_(model.parameters(), 0.01)
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress.batch += 1
            if not accelerator.sync_gradients:
                continue
            progress.step += 1
            step = progress.step
            losses[step] = float(sum(pending) / len(pending))
            pending = []
            lrs[step] = scheduler.get_last_lr()[0]
            draws[step] = torch.rand(1).item()  # the generator save_state keeps
            accelerator.log({"loss": losses[step], "lr": lrs[step]}, step=step)
            if step == args.save_at:
                saved[step] = accelerator.save_state()
            if step == args.signal_at:
                if args.raise_sig:
                    if args.raise_rank in (None, accelerator.process_index):
                        signal.raise_signal(getattr(signal, args.raise_sig))
                elif accelerator.is_main_process:
                    os.kill(os.getppid(), signal.SIGINT)
                    # The launcher forwards it to every rank; this rank waits for its own copy.
                    accelerator._interrupts.received.wait(60)
            if step >= STEPS:
                break
        progress.batch = 0

    state = accelerator.get_state_dict(model)
    with accelerator.gathered_parameters(model):
        gathered_shapes = {k: list(v.shape) for k, v in accelerator.unwrap_model(model).state_dict().items()}
    after_shapes = {k: list(v.shape) for k, v in accelerator.unwrap_model(model).state_dict().items()}
    # Ranks with different lengths: padded to the longest, then gathered.
    mine = torch.arange(accelerator.process_index + 1, dtype=torch.float32) + 1
    padded = accelerator.pad_across_processes(mine, pad_index=-1)
    gathered = accelerator.gather(padded)
    pair = accelerator.gather_for_metrics((mine[:1], {"r": torch.tensor([accelerator.process_index])}))
    notes = {"distributed_type": accelerator.distributed_type.value,
             "state_type": accelerator.state.distributed_type.value,
             "is_multi": accelerator.distributed_type == DistributedType.MULTI_CPU,
             "mixed_precision": accelerator.mixed_precision, "num_processes": accelerator.state.num_processes,
             "gathered": gathered.tolist(),
             "pair": [pair[0].tolist(), pair[1]["r"].tolist()], "gathered_shapes": gathered_shapes, "after_shapes": after_shapes}

    @accelerator.on_main_process
    def write():
        accelerator.save({k: v for k, v in state.items()}, os.path.join(args.out, "state.pt"))
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump({"losses": losses, "lrs": lrs, "saved": saved, "notes": notes, "draws": draws,
                       "memory": accelerator.memory()}, f)

    @accelerator.on_local_main_process
    def mark():
        return "local main"

    write()
    notes["local"] = mark()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    model, optimizer = accelerator.free_memory(model, optimizer)
    print("done rank %d local=%s model=%s" % (accelerator.process_index, notes["local"], model))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
