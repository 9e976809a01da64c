"""Multi-rank training through the bindings: 2 ranks under `tinyacc launch`
train one model on slices of the global batch, so they report the losses of
one process that reads the whole global batch."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import PKG, small_config

# Every rank prints its own losses, so the test also sees that the ranks
# agree with each other (the example script prints on rank 0 only).
SCRIPT = textwrap.dedent("""
    import json, sys
    from tinyacc import Accelerator
    from tinyacc.data import TextDataLoader
    from tinyacc.models import GPT, GPTConfig
    from tinyacc.optim import AdamW

    acc = Accelerator(sys.argv[1])
    model = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(model.parameters())
    loader = TextDataLoader()
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    for x, y in loader:
        acc.backward(model(x, y))
        if opt.step():
            losses.append(opt.last_metrics["loss"])
        opt.zero_grad()
    print("LOSSES", acc.process_index, acc.num_processes, json.dumps(losses), flush=True)
    acc.end_training()
""")


def run_ranks(cli, tmp_path, config, nproc):
    """{rank: losses} of SCRIPT on nproc ranks (1 = a plain process)."""
    script = tmp_path / "dp_train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script), config]
    if nproc > 1:
        cmd = [cli, "launch", "--nproc", str(nproc), "--"] + cmd
    out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=PKG), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    found = {}
    for m in re.finditer(r"LOSSES (\d+) (\d+) (\[.*\])", out.stdout):
        assert int(m.group(2)) == nproc
        found[int(m.group(1))] = json.loads(m.group(3))
    assert sorted(found) == list(range(nproc)), out.stdout + out.stderr
    return found


@pytest.mark.parametrize("stage", [0, 2])
def test_two_ranks_train_like_one_process_with_the_global_batch(cli, corpus, tmp_path, stage):
    def config(name, batch):
        p = tmp_path / name
        p.write_text(small_config(corpus, steps=5, batch_size=batch, grad_accum=2) + "zero: {stage: %d}\n" % stage)
        return str(p)

    want = run_ranks(cli, tmp_path, config("one.yaml", 4), 1)[0]
    got = run_ranks(cli, tmp_path, config("two.yaml", 2), 2)
    assert len(want) == 5
    for rank, losses in got.items():
        assert losses == pytest.approx(want, rel=1e-5), "rank %d" % rank
    # Two ranks each training their own model on half the batch would
    # drift away from the reference; make sure the data did differ.
    half = run_ranks(cli, tmp_path, config("half.yaml", 2), 1)[0]
    assert half != pytest.approx(want, rel=1e-5)


PLACED = textwrap.dedent("""
    import json, sys
    from tinyacc import Accelerator
    from tinyacc.data import TextDataLoader
    from tinyacc.models import GPT, GPTConfig
    from tinyacc.optim import AdamW

    acc = Accelerator(sys.argv[1])
    model = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(model.parameters())
    model, opt, loader = acc.prepare(model, opt, TextDataLoader())
    model.save(sys.argv[2])  # every rank: the placed parts, gathered
    losses = []
    for x, y in loader:
        acc.backward(model(x, y))
        if opt.step():
            losses.append(opt.last_metrics["loss"])
        opt.zero_grad()
    print("LOSSES", acc.process_index, acc.num_processes, json.dumps(losses), flush=True)
    acc.end_training()
""")


@pytest.mark.parametrize("layout,dp", [("zero: {stage: 3}", 2), ("parallel: {tp: 2, dp: 1}", 1)])
def test_placed_model_starts_from_one_process_weights(cli, corpus, tmp_path, layout, dp):
    """The model a binding creates is placed by prepare (each rank builds
    only its parts): gathered right after prepare it is bitwise the model
    one process builds, and it trains as one process does."""
    script = tmp_path / "placed.py"
    script.write_text(PLACED)

    def run(nproc, batch, name):
        cfg = tmp_path / (name + ".yaml")
        cfg.write_text(small_config(corpus, steps=3, batch_size=batch) + layout + "\n")
        saved = str(tmp_path / (name + ".safetensors"))
        cmd = [sys.executable, str(script), str(cfg), saved]
        if nproc > 1:
            cmd = [cli, "launch", "--nproc", str(nproc), "--"] + cmd
        out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=PKG), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        losses = {int(m.group(1)): json.loads(m.group(3)) for m in re.finditer(r"LOSSES (\d+) (\d+) (\[.*\])", out.stdout)}
        assert sorted(losses) == list(range(nproc)), out.stdout + out.stderr
        with open(saved, "rb") as f:
            return losses, f.read()

    want, one = run(1, 4, "one")
    got, two = run(2, 4 // dp, "two")
    assert two == one
    for rank, losses in got.items():
        assert losses == pytest.approx(want[0], rel=1e-5), "rank %d" % rank
