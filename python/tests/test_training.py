import json
import os
import re
import subprocess
import sys

import pytest

import tinyacc
from tinyacc import Accelerator
from tinyacc.data import TextDataLoader
from tinyacc.models import GPT, GPTConfig
from tinyacc.optim import AdamW

from conftest import PKG, REPO

EXAMPLE = os.path.join(REPO, "examples", "python", "train.py")


def train_losses(config):
    """The PyTorch-style loop; returns the loss of every optimizer step."""
    accelerator = Accelerator(config)
    model = GPT(GPTConfig.from_config(accelerator.config))
    optimizer = AdamW(model.parameters())
    loader = TextDataLoader()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = model(x, y)
        accelerator.backward(loss)
        if optimizer.step():
            losses.append(optimizer.last_metrics["loss"])
        optimizer.zero_grad()
    return losses


def test_loss_falls_over_20_steps(config_file):
    losses = train_losses(config_file(steps=20))
    assert len(losses) == 20
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    # A byte model starts near ln(256) = 5.55 and must learn this corpus.
    assert 5.3 < first < 5.8
    assert last < first - 0.5, losses


def step_losses(text):
    return [float(m.group(2)) for m in re.finditer(r"(?m)^step (\d+) loss (\S+)", text)]


@pytest.mark.parametrize("accum", [1, 2])
def test_python_loop_equals_cli(cli, config_file, tmp_path, accum):
    cfg = config_file(steps=6, grad_accum=accum)
    metrics = tmp_path / "metrics.jsonl"
    subprocess.run([cli, "train", "--config", cfg, "--metrics_file", str(metrics)], check=True,
                   stdout=subprocess.DEVNULL)
    want = [json.loads(l)["loss"] for l in metrics.read_text().splitlines() if json.loads(l)["kind"] == "train"]
    assert len(want) == 6

    # The example script, as a user runs it, and the loop in-process.
    env = dict(os.environ, PYTHONPATH=PKG)
    out = subprocess.run([sys.executable, EXAMPLE, "--config", cfg], check=True, env=env,
                         capture_output=True, text=True).stdout
    assert step_losses(out) == want
    assert train_losses(cfg) == want


def test_fused_and_loader_steps_equal_the_loop(config_file):
    cfg = config_file(steps=3, grad_accum=2)
    want = train_losses(cfg)

    acc = Accelerator(cfg)
    model = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(model.parameters())
    loader = TextDataLoader()
    acc.prepare(model, opt, loader)
    sess = model._session
    assert [sess.run_step() for _ in range(3)] == want


def test_bad_config_names_the_key(tmp_path):
    with pytest.raises(tinyacc.ConfigError) as e:
        Accelerator({"model": {"n_layrs": 2}})
    assert "model.n_layrs" in str(e.value)
    assert isinstance(e.value, tinyacc.TinyaccError)

    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: fast\n")
    with pytest.raises(tinyacc.TinyaccError, match=r"train\.lr"):
        Accelerator(str(bad))
    with pytest.raises(tinyacc.TinyaccError, match=r"train\.batch_size"):
        TextDataLoader(batch_size=-3).batch(0)


def test_freed_handles_raise(config_file):
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    assert len(model.parameters()) > 0
    model.free()
    with pytest.raises(tinyacc.HandleError, match="already freed"):
        model.parameters()
    with pytest.raises(tinyacc.HandleError, match="already freed"):
        model.free()

    acc = Accelerator(config_file(steps=2))
    m = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(m.parameters())
    acc.prepare(m, opt)
    x = [[1, 2, 3, 4]]
    loss = m(x, [[2, 3, 4, 5]])
    loss.free()
    with pytest.raises(tinyacc.HandleError, match="already freed"):
        acc.backward(loss)
    loss = m(x, [[2, 3, 4, 5]])
    acc.backward(loss)
    with pytest.raises(tinyacc.TinyaccError, match="already backpropagated"):
        loss.backward()
    with pytest.raises(tinyacc.TinyaccError, match="outside the vocabulary"):
        m([[999]], [[1]])


def test_parameters_state_and_checkpoints(config_file, tmp_path):
    np = pytest.importorskip("numpy")
    cfg = config_file(steps=4)
    acc = Accelerator(cfg)
    model = GPT(GPTConfig.from_config(acc.config))
    opt = AdamW(model.parameters())
    loader = TextDataLoader()
    acc.prepare(model, opt, loader)

    wte = dict(model.named_parameters())["wte.weight"]
    assert wte.shape == (256, 32)
    w = np.arange(256 * 32, dtype=np.float32).reshape(256, 32) / 1000
    wte.copy_(w)
    assert np.array_equal(np.asarray(wte.data), w)
    assert wte.data.tolist()[1][:2] == pytest.approx([0.032, 0.033])
    with pytest.raises(tinyacc.TinyaccError, match="buffer holds 3"):
        wte.copy_([1.0, 2.0, 3.0])

    it = iter(loader)
    for _ in range(2):
        x, y = next(it)
        acc.backward(model(x, y))
        opt.step()
        opt.zero_grad()
    saved = model.state_dict()
    acc.save_state(str(tmp_path / "ckpt"))
    x, y = next(it)
    acc.backward(model(x, y))
    norm = acc.clip_grad_norm_(model.parameters(), 1e9)
    grads = np.concatenate([np.asarray(p.grad).ravel() for p in model.parameters()])
    assert norm == pytest.approx(float(np.sqrt((grads.astype(np.float64) ** 2).sum())), rel=1e-5)
    opt.step()
    assert not np.array_equal(np.asarray(model.state_dict()["wte.weight"]), np.asarray(saved["wte.weight"]))

    # Restoring the checkpoint brings back the weights and the step.
    acc.load_state(str(tmp_path / "ckpt"))
    assert model._session.state() == (2, 0)
    for name, t in model.state_dict().items():
        assert np.array_equal(np.asarray(t), np.asarray(saved[name])), name
    assert len(loader) == 2  # steps 2 and 3 remain


def test_no_grad_evaluate_and_generate(config_file):
    acc = Accelerator(config_file(steps=2))
    model = GPT(GPTConfig.from_config(acc.config))
    acc.prepare(model, AdamW(model.parameters()), TextDataLoader())
    with tinyacc.no_grad():
        loss = model([[1, 2, 3]], [[2, 3, 4]])
    with pytest.raises(RuntimeError, match="without a graph"):
        loss.backward()
    assert 4.5 < loss.item() < 6.5
    assert 4.5 < acc.evaluate() < 6.5
    text = model.generate("func", 5, temperature=0)
    assert isinstance(text, str)
    assert model.generate([102, 117], 4, temperature=0) == model.generate([102, 117], 4, temperature=0)
