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
            if m["step"] >= 4:
                losses.append(m["loss"])
            if mode == "full" and m["step"] == 3:
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


@pytest.mark.parametrize("nproc,stage", [(1, 0), (2, 0), (2, 2)])
def test_resume_continues_exactly(cli, corpus, tmp_path, nproc, stage):
    script = tmp_path / "resume.py"
    script.write_text(SCRIPT)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(small_config(corpus, steps=8, batch_size=2, grad_accum=2) + "zero: {stage: %d}\n" % stage)
    ckpt = tmp_path / "ckpt"
    full = run(cli, script, str(cfg), ckpt, "full", nproc)
    assert sorted(os.listdir(ckpt)) == sorted(
        ["model.safetensors", "state.json"]
        + (["optimizer.rank%d.safetensors" % r for r in range(nproc)] if stage else ["optimizer.safetensors"]))
    resumed = run(cli, script, str(cfg), ckpt, "resume", nproc)
    for rank in range(nproc):
        assert len(full[rank]) == 4
        assert resumed[rank] == full[rank], "rank %d" % rank
