"""Bucketed DDP overlaps communication with backward: with every bucket's
all-reduce withheld until backward has returned, backward still ends, with
every bucket started (the proof of overlap, by construction); the
reducer's trace holds every bucket's announcement and all-reduce in each
step (when an all-reduce finishes relative to backward depends on
scheduling, so it is not asserted); gradients stay views into their
buckets across steps. ZeRO-2's gradient reduce-scatters, withheld the same
way, let backward end too. And the prepared loader's sharding and padding
across real ranks."""

import json
import os

import torch

from torch_models import launch


def rounds(events):
    """The trace's spans split into rounds, each ending with its wait."""
    evs = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    waits = [e for e in evs if e["name"] == "buckets wait"]
    out, start = [], 0.0
    for w in waits:
        end = w["ts"] + w["dur"]
        out.append([e for e in evs if start <= e["ts"] and e["ts"] + e["dur"] <= end and e is not w])
        start = end
    return out


def test_every_bucket_is_traced_and_grads_stay_views(cli, tmp_path):
    trace = os.path.join(str(tmp_path), "trace.json")
    cfg = {"trace": trace, "ddp": {"bucket_mb": 0.6, "first_bucket_mb": 0.6}}
    got = launch(cli, 2, {"overlap": True, "steps": 3, "config": cfg}, tmp_path)
    assert got["buckets"] >= 3
    with open(os.path.join(str(tmp_path), "trace.rank0.json")) as f:
        events = json.load(f)["traceEvents"]
    rs = rounds(events)
    assert len(rs) == 3
    for r in rs:
        ready = [e for e in r if e["name"].endswith(" ready")]
        done = [e for e in r if e["name"].startswith("all-reduce bucket")]
        assert len(ready) == got["buckets"] and len(done) == got["buckets"] + 1  # + the used-mask
    # .grad is the same view into its bucket at every step.
    assert all(got["inside"].values()), got["inside"]
    assert got["ptrs"][0] == got["ptrs"][1] == got["ptrs"][2]


def test_backward_ends_with_every_bucket_withheld(cli, tmp_path):
    """The overlap by construction (torch_models.BucketGate): no wait for a
    bucket's all-reduce may return before loss.backward() has returned, so
    an engine that waits for a bucket during backward fails the launch by
    the gate's deadline; this one reaches the end of every backward with
    all its buckets started and none waited for."""
    cfg = {"ddp": {"bucket_mb": 0.6, "first_bucket_mb": 0.6}}
    got = launch(cli, 2, {"overlap": True, "gate": True, "steps": 3, "config": cfg}, tmp_path)
    assert got["buckets"] >= 3
    assert got["withheld"] == [got["buckets"]] * 3, got


def test_zero2_backward_ends_with_every_reduce_scatter_withheld(cli, tmp_path):
    """ZeRO-2 through the same gate: every reduce-scatter window of a
    backward starts from its hooks and none is waited for (nor a blocking
    collective called) before loss.backward() has returned. Buckets of
    1.2 MB on 2 ranks: DeepModel's four layers are four buckets of one
    window each, all of which may travel at once."""
    cfg = {"zero": {"stage": 2}, "ddp": {"bucket_mb": 1.2}}
    got = launch(cli, 2, {"overlap": True, "gate": True, "steps": 3, "config": cfg}, tmp_path)
    assert 3 <= got["windows"] <= got["inflight"], got
    assert got["withheld"] == [got["windows"]] * 3, got


def test_sharded_loader_pads_and_gather_for_metrics_drops_the_padding(cli, tmp_path):
    """10 samples, batch 2 on 2 ranks: 3 batches each (the last global
    batch padded with samples from the start); gathered for metrics, every
    sample once, in the order one process reads them with batch 4."""
    got = launch(cli, 2, {"metrics": True, "n": 10, "batch": 2, "shuffle": True}, tmp_path)
    assert got["batches"] == 3
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(11)).tolist()
    assert got["gathered"] == perm
    # Rank 0 read batches 0, 2, 4 of the padded order, rank 1 batches 1, 3, 5.
    padded = perm + perm[:2]
    assert got["read"] == sum((padded[k * 2:k * 2 + 2] for k in (0, 2, 4)), []) + sum((padded[k * 2:k * 2 + 2] for k in (1, 3, 5)), [])
