"""Config layering is the command line's in every binding: the same file or
dict, TINYACC_* environment and explicit arguments resolve to the config
`tinyacc config show` prints for that file, environment and flags."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PKG

YAML = "model: {n_layer: 3, n_embd: 48, n_head: 4}\ntrain: {lr: 0.01, steps: 7, batch_size: 2}\ncomm: {timeout: 90s}\n"
ENV = {"TINYACC_TRAIN__LR": "0.002", "TINYACC_TRAIN__STEPS": "9", "TINYACC_COMM__TIMEOUT": "2s"}


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINYACC_") or k == "TINYACC_LIB"}
    env["PYTHONPATH"] = PKG
    env.update(extra)
    return env


def _shown(cli, *args, env):
    """config show's KEY -> VALUE columns."""
    out = subprocess.run([cli, "config", "show"] + list(args), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.strip().splitlines()[1:]]
    return {r[0]: r[1] for r in rows}


def _python(code, env):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120)
    return out


def test_every_binding_resolves_like_config_show(cli, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(YAML)
    env = _clean_env(**ENV)
    want = _shown(cli, "--config", str(path), "--train.steps=11", "--model.n_layer=2", "--train.grad_accum=3", env=env)
    assert (want["train.lr"], want["train.steps"], want["model.n_layer"], want["comm.timeout"], want["train.grad_accum"]) == \
        ("0.002", "11", "2", "2s", "3")

    # Each Python entry point writes the config it resolved as JSON; the
    # command line reads that back with no environment, in its spelling.
    script = tmp_path / "resolve.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        from tinyacc import Accelerator, Config
        path, out = sys.argv[1], sys.argv[2]
        explicit = {"train": {"steps": 11, "grad_accum": 3}, "model": {"n_layer": 2}}
        doc = {
            "path": Accelerator(path, gradient_accumulation_steps=3).config.with_overrides(
                {"train": {"steps": 11}, "model": {"n_layer": 2}}).to_dict(),
            "dict": Accelerator({"model": {"n_layer": 3, "n_embd": 48, "n_head": 4},
                                 "train": {"lr": 0.01, "steps": 7, "batch_size": 2},
                                 "comm": {"timeout": "90s"}}).config.with_overrides(explicit).to_dict(),
            "resolve": Config.resolve(file=path, overrides=explicit).to_dict(),
        }
        json.dump(doc, open(out, "w"))
    """))
    out = tmp_path / "resolved.json"
    r = subprocess.run([sys.executable, str(script), str(path), str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name, values in json.loads(out.read_text()).items():
        f = tmp_path / (name + ".json")
        f.write_text(json.dumps(values))
        assert _shown(cli, "--config", str(f), env=_clean_env()) == want, name


def test_unknown_variable_is_an_error_with_the_nearest_name():
    env = _clean_env(TINYACC_COMM_TIMEOUT="2s")
    for expr in ("Accelerator({})", "Accelerator(None)", "Config.from_dict({'train': {'lr': 0.1}})"):
        out = _python("""
            from tinyacc import Accelerator, Config, ConfigError
            try:
                %s
            except ConfigError as e:
                print("ERR", e)
        """ % expr, env)
        assert out.returncode == 0, out.stderr
        assert 'unknown key "comm_timeout" (from env TINYACC_COMM_TIMEOUT)' in out.stdout, (expr, out.stdout)
        assert "did you mean TINYACC_COMM__TIMEOUT?" in out.stdout, (expr, out.stdout)


BARRIER = textwrap.dedent("""
    import sys, threading
    from tinyacc import Accelerator, TinyaccError
    acc = Accelerator(CONFIG)
    if acc.process_index == 1:
        threading.Event().wait()  # never reaches the barrier; the launcher ends it
    try:
        acc.wait_for_everyone()
    except TinyaccError as e:
        print("BARRIER FAILED:", e, flush=True)
        sys.exit(3)
""")


@pytest.mark.parametrize("where", ["env", "dict"])
def test_wait_for_everyone_is_bounded_by_comm_timeout(cli, tmp_path, where):
    """comm.timeout bounds the barrier whether it comes from the
    environment or from the dict the Accelerator is given."""
    script = tmp_path / "barrier.py"
    config = {"comm": {"timeout": "2s"}} if where == "dict" else {}
    script.write_text(BARRIER.replace("CONFIG", repr(config)))
    env = _clean_env(TINYACC_COMM__TIMEOUT="2s") if where == "env" else _clean_env()
    out = subprocess.run([cli, "launch", "--nproc", "2", "--", sys.executable, str(script)], env=env,
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 3, text
    line = next(l for l in text.splitlines() if "BARRIER FAILED:" in l)
    assert "barrier" in line and "ranks [1] did not arrive" in line and "after 2s" in line, line


MODEL = textwrap.dedent("""
    from tinyacc.models import GPT, GPTConfig
    print(GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4)).config.n_layer, GPT(GPTConfig(n_embd=32, n_head=4)).config.n_layer)
""")


def test_model_arguments_win_over_the_environment(tmp_path):
    """GPT(GPTConfig(...)) built without an Accelerator: the arguments it
    gives are the top layer; what it leaves out comes from TINYACC_*."""
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    out = subprocess.run([sys.executable, str(script)], env=_clean_env(TINYACC_MODEL__N_LAYER="3"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "3"], out.stdout
