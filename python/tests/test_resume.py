"""Checkpoints resume exactly: 8 steps straight give the same losses over
steps 4-7 as 4 steps, save_state, and a fresh process that load_states and
trains 4 more, because AdamW's step counts travel with its moments."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import PKG, small_config

SCRIPT = textwrap.dedent("""
    import json, sys
    from tinyacc import Accelerator
    from tinyacc.data import TextDataLoader
    from tinyacc.models import GPT, GPTConfig
    from tinyacc.optim import AdamW

    config, ckpt, mode = sys.argv[1:4]
    acc = Accelerator(config)
    model = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(model.parameters())
    loader = TextDataLoader()
    model, opt, loader = acc.prepare(model, opt, loader)
    if mode == "resume":
        acc.load_state(ckpt)
    losses = []
    for x, y in loader:
        acc.backward(model(x, y))
        if opt.step():
            m = opt.last_metrics
            if m["step"] >= 5:  # steps count completed steps: the 5th to the 8th
                losses.append(m["loss"])
            if mode == "full" and m["step"] == 4:
                acc.save_state(ckpt)
        opt.zero_grad()
    print("LOSSES", acc.process_index, json.dumps(losses), flush=True)
    acc.end_training()
""")


def run(cli, script, config, ckpt, mode, nproc):
    cmd = [sys.executable, str(script), config, str(ckpt), mode]
    if nproc > 1:
        cmd = [cli, "launch", "--nproc", str(nproc), "--"] + cmd
    out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=PKG), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    found = {int(m.group(1)): json.loads(m.group(2)) for m in re.finditer(r"LOSSES (\d+) (\[.*\])", out.stdout)}
    assert sorted(found) == list(range(nproc)), out.stdout + out.stderr
    return found


def config_file(tmp_path, corpus, nproc, stage):
    """A run of global batch 4 (2 micro-batches of 2 per process and step)."""
    cfg = tmp_path / ("run-%d-%d.yaml" % (nproc, stage))
    cfg.write_text(small_config(corpus, steps=8, batch_size=4 // (2 * nproc), grad_accum=2) + "zero: {stage: %d}\n" % stage)
    return str(cfg)


@pytest.mark.parametrize("nproc,stage", [(1, 0), (2, 0), (2, 2)])
def test_resume_continues_exactly(cli, corpus, tmp_path, nproc, stage):
    script = tmp_path / "resume.py"
    script.write_text(SCRIPT)
    cfg = config_file(tmp_path, corpus, nproc, stage)
    ckpt = tmp_path / "ckpt"
    full = run(cli, script, cfg, ckpt, "full", nproc)
    assert sorted(os.listdir(ckpt)) == ["latest", "step-0000004"]  # saved after the 4th step
    resumed = run(cli, script, cfg, ckpt, "resume", nproc)
    for rank in range(nproc):
        assert len(full[rank]) == 4
        assert resumed[rank] == full[rank], "rank %d" % rank


@pytest.mark.parametrize("saved,resumed", [((2, 2), (1, 0)), ((1, 0), (2, 3))])
def test_resume_on_another_layout(cli, corpus, tmp_path, saved, resumed):
    """A checkpoint of 2 processes at ZeRO-2 continues in 1 process, and
    one of a single process continues on 2 at ZeRO-3: same losses."""
    script = tmp_path / "resume.py"
    script.write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    full = run(cli, script, config_file(tmp_path, corpus, *saved), ckpt, "full", saved[0])
    got = run(cli, script, config_file(tmp_path, corpus, *resumed), ckpt, "resume", resumed[0])
    for rank in range(resumed[0]):
        assert got[rank] == pytest.approx(full[0], rel=1e-5), "rank %d" % rank
