"""Bucketed DDP overlaps communication with backward: from the reducer's
trace, a bucket's all-reduce finishes before the last bucket is announced
(which happens inside backward, from an accumulator hook); gradients stay
views into their buckets across steps."""

import json
import os

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


def test_a_bucket_finishes_before_backward_returns(cli, tmp_path):
    trace = os.path.join(str(tmp_path), "trace.json")
    cfg = {"trace": trace, "ddp": {"bucket_mb": 0.6, "first_bucket_mb": 0.6}}
    got = launch(cli, 2, {"overlap": True, "steps": 3, "config": cfg}, tmp_path)
    assert got["buckets"] >= 3
    with open(os.path.join(str(tmp_path), "trace.rank0.json")) as f:
        events = json.load(f)["traceEvents"]
    rs = rounds(events)
    assert len(rs) == 3
    early = 0
    for r in rs:
        ready = [e["ts"] for e in r if e["name"].endswith(" ready")]
        done = [e["ts"] + e["dur"] for e in r if e["name"].startswith("all-reduce bucket")]
        assert len(ready) == got["buckets"] and len(done) == got["buckets"] + 1  # + the used-mask
        if min(done) < max(ready):
            early += 1
    assert early >= 1, "no all-reduce finished while backward was still announcing buckets"
    # .grad is the same view into its bucket at every step.
    assert all(got["inside"].values()), got["inside"]
    assert got["ptrs"][0] == got["ptrs"][1] == got["ptrs"][2]
