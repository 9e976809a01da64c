import os
import subprocess
import sys
import textwrap

import pytest

import tinyacc
from tinyacc import Accelerator, distributed as dist

from conftest import PKG


def test_world_of_one_collectives_return_the_input():
    rank, size = dist.init()
    assert (rank, size) == (0, 1)
    x = [[1.5, -2.0], [3.0, 4.25]]
    for op in ("sum", "mean", "max", "min"):
        assert dist.all_reduce(x, op).tolist() == x
    assert dist.all_gather(x).tolist() == x
    assert dist.reduce_scatter(x).tolist() == x
    assert dist.broadcast(x, 0).tolist() == x
    dist.barrier()
    acc = Accelerator({})
    assert (acc.process_index, acc.num_processes, acc.is_main_process) == (0, 1, True)
    assert acc.gather([7.0]).tolist() == [7.0]
    assert acc.reduce([1.0, 2.0], "mean").tolist() == [1.0, 2.0]
    acc.wait_for_everyone()
    with pytest.raises(tinyacc.TinyaccError, match="root 3 is outside"):
        dist.broadcast(x, 3)
    with pytest.raises(ValueError, match="reduction"):
        dist.all_reduce(x, "prod")


SCRIPT = textwrap.dedent("""
    from tinyacc import distributed as dist
    r, n = dist.init()
    assert n == 2
    s = dist.all_reduce([r + 1.0, 10.0 * r]).tolist()
    g = dist.all_gather([float(r)]).tolist()
    rs = dist.reduce_scatter([1.0 + r, 2.0 + r]).tolist()
    b = dist.broadcast([float(r) + 5], 1).tolist()
    dist.barrier()
    print("rank", r, s, g, rs, b, flush=True)
""")


def test_two_ranks_under_launch(cli, tmp_path):
    script = tmp_path / "coll.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=PKG)
    out = subprocess.run([cli, "launch", "--nproc", "2", "--", sys.executable, str(script)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout + out.stderr
    # Serial reference: rank 0 has [1, 0], rank 1 [2, 10].
    assert "rank 0 [3.0, 10.0] [0.0, 1.0] [3.0] [6.0]" in lines
    assert "rank 1 [3.0, 10.0] [0.0, 1.0] [5.0] [6.0]" in lines
