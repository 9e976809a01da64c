"""A torch model through Accelerator.prepare at zero.stage 0, 1, 2 and 3:
N ranks under `tinyacc launch` train as one process does with the global
batch (losses 1e-5 relative, weights 1e-4 norm-wise, the clip norm
torch's), for AdamW with clipping active and SGD with momentum without,
with gradient accumulation 1 and 3. One launch per number of ranks runs
every case in turn (each with a fresh Accelerator), to keep the test short.
"""

import json
import os

import pytest
import torch

from torch_models import launch, read_model_file, reference

STEPS, BATCH, CLIP = 4, 2, 0.05
# Tiny buckets: the model's 17 parameter tensors spread over several.
BUCKETS = {"bucket_mb": 0.0004, "first_bucket_mb": 0.0001}
SHARED = ("proj_b.weight", "head.weight")  # saved once, under proj_a.weight and emb.weight


def cases(tmp_path):
    out = []
    for stage in (0, 1, 2, 3):
        for grad_accum in (1, 3):
            for opt, clip in (("adamw", CLIP), ("sgd", None)):
                cfg = {"zero": {"stage": stage}, "ddp": dict(BUCKETS, mode="bucketed")}
                if stage == 0:
                    cfg["trace"] = os.path.join(str(tmp_path), "trace%d%s.json" % (grad_accum, opt))
                out.append({"opt": opt, "clip": clip, "grad_accum": grad_accum, "config": cfg, "sched": True})
    out.append({"opt": "adamw", "clip": CLIP, "grad_accum": 3,
                "config": {"zero": {"stage": 0}, "ddp": dict(BUCKETS, mode="naive")}})
    # zero.wrap: every Linear a unit (proj_a's owns the weight proj_b shares);
    # the embedding, LayerNorm and the root's own parameter form the root's.
    out.append({"opt": "sgd", "clip": None, "grad_accum": 3,
                "config": {"zero": {"stage": 3, "wrap": ["Linear"]}, "ddp": dict(BUCKETS, mode="bucketed")}})
    for c in out:
        c.update(steps=STEPS, batch=BATCH)
    return out


def weight_error(got, want):
    num = sum(float(((got[k] - want[k]) ** 2).sum()) for k in got)
    den = sum(float((want[k] ** 2).sum()) for k in got)
    return (num / den) ** 0.5


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_stage_matches_one_process(cli, tmp_path, nproc):
    todo = cases(tmp_path)
    results = launch(cli, nproc, {"cases": todo}, tmp_path, timeout=240)
    assert len(results) == len(todo)
    ddp_bytes = {}
    for case, got in zip(todo, results):
        stage, G, opt, clip = case["config"]["zero"]["stage"], case["grad_accum"], case["opt"], case["clip"]
        tag = "stage=%d accum=%d opt=%s mode=%s nproc=%d" % (stage, G, opt, case["config"]["ddp"]["mode"], nproc)
        losses, norms, want = reference(opt, STEPS, BATCH * nproc * G, clip, sched=case.get("sched", False))
        assert len(got["losses"]) == STEPS, tag
        for a, b in zip(got["losses"], losses):
            assert abs(a - b) <= 1e-5 * abs(b), (tag, got["losses"], losses)
        if clip:
            assert len(got["norms"]) == STEPS, tag
            for a, b in zip(got["norms"], norms):
                assert abs(a - b) <= 1e-5 * b, (tag, got["norms"], norms)
            assert min(norms) > clip, "clipping must be active in every step"
        else:
            assert got["norms"] == [], tag
        # save_model: the module's own names, each shared tensor once under
        # its first name; the weights one process reaches.
        saved = read_model_file(os.path.join(got["model"], "model.safetensors"))
        assert list(saved) == [k for k in want if k not in SHARED], tag
        err = weight_error(saved, want)
        assert err <= 1e-4, "%s: weights differ from plain torch by %g norm-wise" % (tag, err)
        if case["config"]["ddp"]["mode"] == "naive":
            continue
        if stage == 0:
            ddp_bytes[(G, opt)] = got["peak"]
            # Micro-batches that do not sync communicate nothing: one round
            # of bucket all-reduces per optimizer step.
            with open(case["config"]["trace"].replace(".json", ".rank0.json")) as f:
                names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
            assert names.count("buckets wait") == STEPS, tag
            assert names.count("all-reduce bucket 0") == STEPS, tag
        if stage == 2:
            # Per-rank optimizer + gradient bytes <= DDP's / N + one bucket
            # + the largest parameter.
            largest = 4 * max(t.numel() for t in want.values())
            bound = ddp_bytes[(G, opt)] / nproc + BUCKETS["bucket_mb"] * (1 << 20) + largest
            assert got["peak"] <= bound, (tag, got["peak"], ddp_bytes[(G, opt)], bound)
        # What the ranks' parameter tensors hold (torch's storage sizes):
        # ZeRO-3 keeps each parameter whole on its owner only, between
        # uses (after every backward and step) and at the end.
        total = 4 * sum(t.numel() for t in saved.values())
        largest = 4 * max(t.numel() for t in saved.values())
        assert len(got["held_end"]) == len(got["held_peak"]) == nproc, tag
        if stage == 3:
            assert sum(got["held_end"]) == total, (tag, got["held_end"], total)
            for r, held in enumerate(got["held_peak"]):
                assert held <= total / nproc + largest, (tag, r, got["held_peak"], total)
            assert got["memory"]["params_bytes"] == got["held_end"][0], (tag, got["memory"], got["held_end"])
        else:
            assert got["held_end"] == [total] * nproc, (tag, got["held_end"], total)


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_through_save_state(cli, tmp_path, stage):
    """save_state after 2 of 4 steps; a new model (other weights), optimizer
    and loader load it and finish: the losses and weights of one process
    that never stopped."""
    case = {"opt": "adamw", "clip": CLIP, "grad_accum": 3, "steps": STEPS, "batch": BATCH, "resume_at": 2,
            "config": {"zero": {"stage": stage}, "ddp": BUCKETS}}
    got = launch(cli, 2, {"cases": [case]}, tmp_path)[0]
    losses, norms, want = reference("adamw", STEPS, BATCH * 2 * 3, CLIP)
    assert len(got["losses"]) == STEPS
    for a, b in zip(got["losses"] + got["norms"], losses + norms):
        assert abs(a - b) <= 1e-5 * abs(b), (got["losses"], losses, got["norms"], norms)
    saved = read_model_file(os.path.join(got["model"], "model.safetensors"))
    assert weight_error(saved, want) <= 1e-4
