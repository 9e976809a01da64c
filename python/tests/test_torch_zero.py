"""ZeRO-1/2/3 for torch models, under `tinyacc launch`, against plain
PyTorch in one process with the global batch (the checks live in the
launched scripts, which every rank runs; see torch_zero_equiv.py)."""

import os
import subprocess
import sys

import pytest

from conftest import PKG

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(cli, nproc, script, *args):
    env = dict(os.environ, PYTHONPATH=PKG)
    out = subprocess.run([cli, "launch", "--nproc", str(nproc), "--", sys.executable, os.path.join(HERE, script)]
                         + list(args), env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    return text


@pytest.mark.parametrize("nproc", [2, 4])
def test_zero_stages_match_one_process(cli, nproc):
    text = launch(cli, nproc, "torch_zero_equiv.py", "1,2,3")
    for stage in (1, 2, 3):
        for opt in ("adamw", "sgd"):
            for accum in (1, 3):
                tag = "ok stage=%d opt=%s accum=%d world=%d" % (stage, opt, accum, nproc)
                assert text.count(tag) == nproc, "%s missing from\n%s" % (tag, text)
