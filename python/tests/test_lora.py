"""LoRA through the Python face: the engine's GPT built from a run config
with lora.* keys carries adapters beside a frozen base, trains them alone
(one process and 2 ranks under ZeRO-2 alike, the adapters' dropout
included), and a model built without
the run's lora keys is refused at prepare."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tinyacc import Accelerator
from tinyacc.data import TextDataLoader
from tinyacc.models import GPT, GPTConfig
from tinyacc.optim import AdamW

from conftest import PKG, small_config

LORA = "lora: {rank: 4, alpha: 8, targets: [c_attn, c_proj]}\n"

SCRIPT = textwrap.dedent("""
    import json, sys
    from tinyacc import Accelerator
    from tinyacc.data import TextDataLoader
    from tinyacc.models import GPT
    from tinyacc.optim import AdamW

    acc = Accelerator(sys.argv[1])
    model = GPT(acc.config)
    opt = AdamW(model.parameters())
    model, opt, loader = acc.prepare(model, opt, TextDataLoader())
    losses = []
    for x, y in loader:
        acc.backward(model(x, y))
        if opt.step():
            losses.append(opt.last_metrics["loss"])
        opt.zero_grad()
    print("LOSSES", acc.process_index, json.dumps(losses), flush=True)
    acc.end_training()
""")


def test_adapters_train_beside_a_frozen_base(tmp_path, corpus):
    run = tmp_path / "lora.yaml"
    run.write_text(small_config(corpus, steps=4) + LORA)
    acc = Accelerator(str(run))
    model = GPT(acc.config)
    names = [name for name, _ in model.named_parameters()]
    assert "h.0.attn.c_attn.lora_A.weight" in names and "h.0.mlp.c_proj.lora_B.weight" in names
    assert dict(model.named_parameters())["h.0.attn.c_attn.lora_A.weight"].shape == (4, 32)
    assert dict(model.named_parameters())["h.0.attn.c_attn.lora_B.weight"].shape == (96, 4)
    before = {name: p.data.tolist() for name, p in model.named_parameters()}
    assert all(v == 0 for row in before["h.0.attn.c_attn.lora_B.weight"] for v in row)
    opt = AdamW(model.parameters())
    model, opt, loader = acc.prepare(model, opt, TextDataLoader())
    for x, y in loader:
        acc.backward(model(x, y))
        opt.step()
        opt.zero_grad()
    for name, p in model.named_parameters():
        if ".lora_" in name:
            assert p.data.tolist() != before[name], name
        else:
            assert p.data.tolist() == before[name], "frozen %s changed" % name


def test_a_model_without_the_runs_lora_keys_is_refused(tmp_path, corpus):
    run = tmp_path / "lora.yaml"
    run.write_text(small_config(corpus, steps=1) + LORA)
    acc = Accelerator(str(run))
    model = GPT(GPTConfig.from_config(acc.config))  # the model.* keys only
    with pytest.raises(Exception) as e:
        acc.prepare(model, AdamW(model.parameters()), TextDataLoader())
    assert "the run's lora.* keys (lora.rank=4) are not the model's (no adapters): build the model from the run's config, as GPT(accelerator.config) does" in str(e.value)


def test_two_ranks_zero2_train_adapters_like_one_process(cli, corpus, tmp_path):
    script = tmp_path / "lora_train.py"
    script.write_text(SCRIPT)

    def run(name, batch, nproc, dropout=0.1):
        p = tmp_path / name
        p.write_text(small_config(corpus, steps=4, batch_size=batch, grad_accum=2)
                     + LORA.replace("}", ", dropout: %r}" % dropout) + "zero: {stage: 2}\n")
        cmd = [sys.executable, str(script), str(p)]
        if nproc > 1:
            cmd = [cli, "launch", "--nproc", str(nproc), "--"] + cmd
        out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=PKG), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        return {int(m.group(1)): json.loads(m.group(2)) for m in re.finditer(r"LOSSES (\d+) (\[.*\])", out.stdout)}

    want = run("one.yaml", 4, 1)[0]
    got = run("two.yaml", 2, 2)
    assert sorted(got) == [0, 1] and len(want) == 4
    for rank, losses in got.items():
        assert losses == pytest.approx(want, rel=1e-5), "rank %d" % rank
    # The dropout did act: without it the same run trains otherwise.
    assert run("plain.yaml", 4, 1, dropout=0.0)[0][1:] != pytest.approx(want[1:], rel=1e-5)
