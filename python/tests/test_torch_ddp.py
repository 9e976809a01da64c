"""zero.stage 0 for a torch model: N ranks under `tinyacc launch` train as
one process does with the global batch (losses 1e-5 relative, weights 1e-4
norm-wise), bucketed and naive."""

import json
import os

import pytest
import torch

from torch_models import launch, read_model_file, reference

STEPS, BATCH = 4, 2


def weight_error(got, want):
    num = sum(float(((torch.tensor(got[k]) - want[k]) ** 2).sum()) for k in want)
    den = sum(float((want[k] ** 2).sum()) for k in want)
    return (num / den) ** 0.5


@pytest.mark.parametrize("nproc,grad_accum,opt,clip,mode", [
    (2, 1, "adamw", 0.05, "bucketed"),
    (2, 3, "sgd", None, "bucketed"),
    (4, 3, "adamw", 0.05, "bucketed"),
    (4, 1, "sgd", None, "bucketed"),
    (2, 3, "adamw", 0.05, "naive"),
])
def test_ddp_matches_one_process(cli, tmp_path, nproc, grad_accum, opt, clip, mode):
    # Tiny buckets: the model's 17 parameter tensors spread over several.
    cfg = {"zero": {"stage": 0}, "ddp": {"mode": mode, "bucket_mb": 0.0004, "first_bucket_mb": 0.0001}}
    trace = os.path.join(str(tmp_path), "trace.json")
    if mode == "bucketed":
        cfg["trace"] = trace
    got = launch(cli, nproc, {"opt": opt, "steps": STEPS, "batch": BATCH, "grad_accum": grad_accum,
                              "clip": clip, "config": cfg}, tmp_path)
    losses, norms, want = reference(opt, STEPS, BATCH * nproc * grad_accum, clip)
    assert len(got["losses"]) == STEPS
    for a, b in zip(got["losses"], losses):
        assert abs(a - b) <= 1e-5 * abs(b), (got["losses"], losses)
    if clip:
        assert len(got["norms"]) == STEPS
        for a, b in zip(got["norms"], norms):
            assert abs(a - b) <= 1e-5 * b, (got["norms"], norms)
        assert min(norms) > clip, "clipping must be active in every step"
    assert weight_error(got["weights"], want) <= 1e-4
    if mode == "bucketed":
        # Micro-batches that do not sync communicate nothing: one round of
        # bucket all-reduces per optimizer step.
        with open(os.path.join(str(tmp_path), "trace.rank0.json")) as f:
            names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        assert names.count("buckets wait") == STEPS
        per_round = names.count("all-reduce bucket 0")
        assert per_round == STEPS
        assert sum(n.startswith("all-reduce bucket") for n in names) % STEPS == 0
    # save_model: the module's own names, each shared tensor once under
    # its first name.
    saved = read_model_file(os.path.join(str(tmp_path), "model", "model.safetensors"))
    assert list(saved) == [k for k in want if k not in ("proj_b.weight", "head.weight")]
    for k, t in saved.items():
        assert torch.equal(t, torch.tensor(got["weights"][k])), k
