"""An ordinary PyTorch training loop on tinyacc's engine: its own model
class, torch.optim.AdamW and a DataLoader. The lines marked `# tinyacc`
are all that was added to the plain script.

    make python
    PYTHONPATH=python /usr/bin/python3 examples/python/torch_mlp.py
    PYTHONPATH=python build/tinyacc launch --nproc 2 -- /usr/bin/python3 examples/python/torch_mlp.py

PyTorch computes forward and backward in each process; the engine averages
the gradients over the ranks (in buckets, while backward runs) and shards
the loader, so N ranks with batch_size 16 train as one process with 16·N.
"""

import torch
import torch.nn.functional as F

from tinyacc import Accelerator  # tinyacc


class MLP(torch.nn.Module):
    def __init__(self, d_in=16, hidden=64, classes=4):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(),
                                       torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, hidden),
                                       torch.nn.GELU(), torch.nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def data(n=2048, d_in=16, classes=4):
    """Points labelled by which of `classes` random directions they lean to."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d_in, generator=g)
    centers = torch.randn(classes, d_in, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ centers.t()).argmax(1))


def main():
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=2)  # tinyacc
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    loader = torch.utils.data.DataLoader(data(), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # tinyacc

    for epoch in range(3):
        correct = total = 0
        for x, y in loader:
            with accelerator.accumulate(model):  # tinyacc
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                accelerator.backward(loss)  # tinyacc: was loss.backward()
                if accelerator.sync_gradients:  # tinyacc
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)  # tinyacc: was torch.nn.utils.clip_grad_norm_
                optimizer.step()
                optimizer.zero_grad()
            preds = accelerator.gather_for_metrics(logits.argmax(1))  # tinyacc
            labels = accelerator.gather_for_metrics(y)  # tinyacc
            correct += int((preds == labels).sum())
            total += len(labels)
        accelerator.print("epoch %d: loss %.4f, train accuracy %.3f over %d samples"  # tinyacc: was print
                          % (epoch, loss.item(), correct / total, total))
    accelerator.save_model(model, "build/torch_mlp")  # tinyacc: was torch.save(model.state_dict(), ...)
    accelerator.print("memory:", accelerator.memory())  # tinyacc
    accelerator.end_training()  # tinyacc


if __name__ == "__main__":
    main()
