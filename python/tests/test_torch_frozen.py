"""A torch model with a frozen backbone (requires_grad=False) through
Accelerator.prepare at 2 ranks: DDP and ZeRO 1, 2, 3 train as plain PyTorch
does on the global batch, the frozen weights stay bitwise what they were,
and every step's communication is exactly the trainable parameters' (the
frozen ones get no bucket, no shard and no collective). See torch_frozen.py
for the model and the worker."""

import torch

from torch_frozen import launch, new_model, reference

STEPS, BATCH, NPROC = 3, 4, 2
STAGES = (0, 1, 2, 3)


def expected_bytes(stage, trainable):
    """Bytes one rank sends per step at 2 ranks, from the trainable
    parameters' sizes only. At N = 2 every collective sends its payload
    once: an all-reduce of n bytes n (ring 2(N-1)/N·n, direct (N-1)·n), an
    all-gather of B bytes per rank B, a reduce-scatter of N·B bytes B.
    T trainable elements in P tensors; each step also all-reduces one float
    per trainable tensor (which were used on some rank).
      DDP:      the buckets' all-reduce                      4T + 4P
      ZeRO-1/2: reduce-scatter of T/2 per rank, all-gather
                of the T/2 updated elements                  4T + 4P
      ZeRO-3:   each unit's one tensor gathered for forward
                and for backward, its gradient reduce-
                scattered                                    3·4T + 4P"""
    T, P = sum(trainable), len(trainable)
    assert T % NPROC == 0  # element ranges without padding
    return 4 * (3 * T if stage == 3 else T) + 4 * P


def test_frozen_backbone_matches_torch_and_is_not_communicated(cli, tmp_path):
    cases = [{"zero": {"stage": s}} for s in STAGES]
    results = launch(cli, NPROC, {"cases": cases, "steps": STEPS, "batch": BATCH}, tmp_path)
    losses, want = reference(STEPS, BATCH * NPROC)
    start = new_model()
    frozen = [n for n, p in start.named_parameters() if not p.requires_grad]
    trainable = [p.numel() for p in start.parameters() if p.requires_grad]
    assert sorted(frozen) == ["backbone.0.bias", "backbone.0.weight", "backbone.2.bias", "backbone.2.weight", "scale"]
    assert trainable == [16 * 16, 4 * 16]
    for stage, got in zip(STAGES, results):
        tag = "stage=%d" % stage
        for a, b in zip(got["losses"], losses):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (tag, got["losses"], losses)
        w = {k: torch.tensor(v) for k, v in got["weights"].items()}
        assert set(w) == set(want), (tag, sorted(w))
        for n in frozen:
            assert torch.equal(w[n], start.state_dict()[n]), (tag, n)
        num = sum(float(((w[k] - want[k]) ** 2).sum()) for k in want)
        den = sum(float((want[k] ** 2).sum()) for k in want)
        assert (num / den) ** 0.5 <= 1e-4, (tag, num, den)
        moved = sum(float(((w[k] - start.state_dict()[k]) ** 2).sum()) for k in want)
        assert moved > 0, tag  # the adapter and head did train
        step = expected_bytes(stage, trainable)
        assert got["sent_per_rank"] == [[step] * NPROC] * STEPS, (tag, got["sent_per_rank"], step)
