"""Accelerate and torchrun parity: accelerate_script.py, a script written
with Accelerate's names only, run as one process and as 2 ranks under
`tinyacc launch --nproc_per_node 2 script.py`: the same losses (1e-5), the
same learning rates step by step, get_state_dict at ZeRO-3 equal to one
process's state dict; save_state at step 3 resumed by load_state and
skip_first_batches bitwise; Ctrl-C at step 3 stops every rank with 130
after saving, and the resume is bitwise too."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch

from conftest import PKG

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "accelerate_script.py")
STEPS = 6


def run(cmd, expect=0, **env):
    full = dict(os.environ, PYTHONPATH=PKG, **env)
    p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)
    text = p.stdout + p.stderr
    assert p.returncode == expect, text
    return text


def launched(cli, out, *args, stage=3, expect=0):
    return run([cli, "launch", "--nproc_per_node", "2", SCRIPT, str(out)] + list(args), expect,
               TINYACC_ZERO__STAGE=str(stage))


def result(out):
    with open(os.path.join(str(out), "result.json")) as f:
        r = json.load(f)
    r["state"] = torch.load(os.path.join(str(out), "state.pt"))
    return r


def checkpoint(out, n):
    return os.path.join(str(out), "project", "checkpoints", "checkpoint_%d" % n)


@pytest.fixture(scope="module")
def runs(cli, tmp_path_factory):
    """One process (the reference), and 2 ranks at ZeRO-3, both saving at step 3."""
    base = tmp_path_factory.mktemp("parity")
    one, two = base / "one", base / "two"
    run([sys.executable, SCRIPT, str(one), "--save-at", "3"])
    text = launched(cli, two, "--save-at", "3")
    return {"one": result(one), "two": result(two), "two_dir": two, "two_text": text}


def test_two_ranks_match_one_process(runs):
    one, two = runs["one"], runs["two"]
    assert sorted(two["losses"], key=int) == [str(s) for s in range(1, STEPS + 1)]
    for s, want in one["losses"].items():
        assert abs(two["losses"][s] - want) <= 1e-5 * abs(want), (s, one["losses"], two["losses"])
    # The scheduler steps once per optimizer step, as in the one-process loop.
    assert two["lrs"] == one["lrs"]
    # ... and as the schedule says: LambdaLR at k optimizer steps (not at
    # 2k micro-batches, nor 2·2k with Accelerate's default at 2 ranks).
    assert one["lrs"] == {str(k): 1e-2 * min(1.0, (k + 1) / 8) for k in range(1, STEPS + 1)}
    # get_state_dict at ZeRO-3: every name of the module's state dict, whole.
    assert list(two["state"]) == list(one["state"])
    for k, want in one["state"].items():
        got = two["state"][k]
        assert got.shape == want.shape, k
        assert float((got - want).norm()) <= 1e-4 * float(want.norm()), k
    assert any(k.startswith("rnn.weight_hh") for k in two["state"]), "the GRU's flat weights are sharded too"
    # unwrap_model under ZeRO-3: a rank's unowned parameters are empty
    # between forward passes, whole inside gathered_parameters.
    shapes = {k: list(v.shape) for k, v in one["state"].items()}
    assert two["notes"]["gathered_shapes"] == shapes
    assert two["notes"]["after_shapes"] != shapes and [0] in two["notes"]["after_shapes"].values()
    assert one["notes"]["after_shapes"] == shapes
    # ZeRO-3 holds about half the parameters per rank.
    total = 4 * sum(t.numel() for t in one["state"].values())
    assert two["memory"]["params_bytes"] < total
    notes = two["notes"]
    assert notes["distributed_type"] == notes["state_type"] == "MULTI_CPU" and notes["is_multi"]
    assert one["notes"]["distributed_type"] == "NO" and one["notes"]["num_processes"] == 1
    assert notes["mixed_precision"] == "no" and notes["num_processes"] == 2
    # pad_across_processes: rank 0's [1] padded with -1 to rank 1's length 2.
    assert notes["gathered"] == [1.0, -1.0, 1.0, 2.0]
    assert one["notes"]["gathered"] == [1.0]
    # gather_for_metrics of a tuple holding a tensor and a dict of one.
    assert notes["pair"] == [[1.0, 1.0], [0, 1]] and one["notes"]["pair"] == [[1.0], [0]]
    # on_local_main_process ran on rank 0 only; free_memory returned None.
    assert "[rank 0] done rank 0 local=local main model=None" in runs["two_text"]
    assert "[rank 1] done rank 1 local=None model=None" in runs["two_text"]


def test_log_writes_the_metrics_file(runs):
    path = os.path.join(str(runs["two_dir"]), "project", "charlm", "metrics.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert rows[0] == {"kind": "config", "config": {"global_batch": 8, "accum": 2}}
    assert [r["step"] for r in rows[1:]] == list(range(1, STEPS + 1))
    for r in rows[1:]:
        assert list(r) == ["kind", "step", "loss", "lr"] and r["kind"] == "train"
        assert r["loss"] == runs["two"]["losses"][str(r["step"])]
        assert r["lr"] == runs["two"]["lrs"][str(r["step"])]


def test_save_state_files(runs):
    d = checkpoint(runs["two_dir"], 0)
    assert runs["two"]["saved"] == {"3": d}
    assert sorted(os.listdir(d)) == ["custom_checkpoint_0.pkl", "model.safetensors", "optimizer.bin",
                                     "random_states_0.pkl", "random_states_1.pkl", "scheduler.bin", "state.json"]
    assert torch.load(os.path.join(d, "custom_checkpoint_0.pkl")) == {"step": 3, "epoch": 0, "batch": 6}
    with open(os.path.join(d, "state.json")) as f:
        assert json.load(f)["optimizer_steps"] == 3


def _resumed_matches(ref, out):
    got = result(out)
    assert got["losses"] == {s: v for s, v in ref["losses"].items() if int(s) > 3}, (got["losses"], ref["losses"])
    assert got["lrs"] == {s: v for s, v in ref["lrs"].items() if int(s) > 3}
    assert got["draws"] == {s: v for s, v in ref["draws"].items() if int(s) > 3}
    assert list(got["state"]) == list(ref["state"])
    for k, want in ref["state"].items():
        assert torch.equal(got["state"][k], want), k


def test_resume_continues_bitwise(cli, runs, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(os.path.join(str(runs["two_dir"]), "project", "checkpoints"),
                    os.path.join(str(out), "project", "checkpoints"))
    launched(cli, out, "--resume")
    _resumed_matches(runs["two"], out)


def test_ctrl_c_stops_every_rank_saves_and_resumes(cli, runs, tmp_path):
    out = tmp_path / "interrupted"
    text = launched(cli, out, "--signal-at", "3", expect=130)
    for r in (0, 1):
        assert "[rank %d] tinyacc: rank %d stopped by SIGINT after 3 optimizer steps; state saved to %s\n" % (
            r, r, checkpoint(out, 0)) in text, text
    assert not os.path.exists(os.path.join(str(out), "result.json")), "training stopped"
    launched(cli, out, "--resume")
    _resumed_matches(runs["two"], out)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_exits_with_the_signal(tmp_path):
    """Two ranks started without the launcher, rank 1 alone getting SIGTERM
    after step 3: both exit 143 at the same boundary (they agree), after
    checkpoint_every=2 saved step 2 and the stop step 3."""
    out = tmp_path / "term"
    port = _free_port()
    procs = []
    for r in (0, 1):
        env = dict(os.environ, PYTHONPATH=PKG, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TINYACC_JOB_TOKEN="parity-test")
        cmd = [sys.executable, SCRIPT, str(out), "--signal-at", "3", "--raise", "SIGTERM", "--raise-rank", "1",
               "--checkpoint-every", "2"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for r, p in enumerate(procs):
        text, _ = p.communicate(timeout=300)
        assert p.returncode == 128 + signal.SIGTERM, text
        assert "tinyacc: rank %d stopped by SIGTERM after 3 optimizer steps; state saved to %s\n" % (
            r, checkpoint(out, 1)) in text, text
    for n, steps in ((0, 2), (1, 3)):
        with open(os.path.join(checkpoint(out, n), "state.json")) as f:
            assert json.load(f)["optimizer_steps"] == steps


def test_one_process_ctrl_c_exits_130(tmp_path):
    text = run([sys.executable, SCRIPT, str(tmp_path), "--signal-at", "2", "--raise", "SIGINT"], expect=130)
    assert "tinyacc: rank 0 stopped by SIGINT after 2 optimizer steps; state saved to %s\n" % checkpoint(tmp_path, 0) in text
    assert "Traceback" not in text


def test_python_m_tinyacc_launch(cli, tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text("import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], sys.executable, sys.argv[1:])\n")
    text = run([sys.executable, "-m", "tinyacc.launch", "--nproc_per_node", "2", "--master_port", str(_free_port()),
                str(script), "--flag", "x"], TINYACC_CLI=cli)
    for r in (0, 1):
        assert "[rank %d] rank %d of 2 %s ['--flag', 'x']\n" % (r, r, sys.executable) in text, text


def test_zero_memory_formula(cli):
    """accelerator.memory() at 2 ranks against the README's per-rank bytes
    (AdamW: K = 2 states per element, each rank owning an equal range):
    ZeRO-1 4P + 4P + 4KP/N + bucket, ZeRO-2 4P + 4P/N + 4KP/N + bucket, the
    bucket 4(N+1)·min(bucket_mb MiB / 4(N+1), ceil(G/N)) with G the largest
    shard group's elements (the whole model at stage 1); optimizer bytes
    up to one 4-byte step count per owned piece."""
    text = run([cli, "launch", "--nproc_per_node", "2", os.path.join(HERE, "zero_memory.py")])
    rows = [json.loads(line.split("] ", 1)[1]) for line in text.splitlines() if line.startswith("[rank 0] {")]
    assert len(rows) == 6, text
    N, K = 2, 2
    for r in rows:
        P, m, stage = r["elements"], r["memory"], r["stage"]
        tag = "stage=%d bucket_mb=%g: %s" % (stage, r["bucket_mb"], m)
        window = min(int(r["bucket_mb"] * (1 << 20) / 4) // (N + 1), -(-P // N))
        if stage == 2 and r["bucket_mb"] < 1:
            # Buckets of at most N windows: the largest group is N windows.
            window = int(r["bucket_mb"] * (1 << 20) / 4) // (N + 1)
        want = {0: dict(params_bytes=4 * P, grads_bytes=4 * P, bucket_bytes=0),
                1: dict(params_bytes=4 * P, grads_bytes=4 * P, bucket_bytes=4 * (N + 1) * window),
                2: dict(params_bytes=4 * P, grads_bytes=4 * P // N, bucket_bytes=4 * (N + 1) * window)}[stage]
        for k, v in want.items():
            assert m[k] == v, (k, v, tag)
        optim = 4 * K * P if stage == 0 else 4 * K * P // N
        assert optim <= m["optim_bytes"] <= optim + 4 * (r["tensors"] + 4), tag
        assert m["total_bytes"] == m["params_bytes"] + m["grads_bytes"] + m["optim_bytes"] + m["bucket_bytes"], tag
    by = {(r["stage"], r["bucket_mb"]): r["memory"]["total_bytes"] for r in rows}
    # A bucket as large as the model eats ZeRO-1's saving at 2 ranks (4KP/N = 4P
    # saved, 4(N+1)P/N = 6P added); a small one keeps it.
    assert by[(1, 25)] > by[(0, 25)] > by[(1, 0.02)]
