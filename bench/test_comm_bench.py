"""Tests for gloo_comm.py and compare_comm.py: /usr/bin/python3 -m pytest bench/"""

import json
import os
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import compare_comm  # noqa: E402
import gloo_comm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def test_parse_sizes_binary_units():
    assert gloo_comm.parse_sizes("4K,64K,1M,16M,64M") == [4096, 65536, 1048576, 16777216, 67108864]
    assert gloo_comm.parse_sizes("100, 2k,1MiB,1G") == [100, 2048, 1048576, 1073741824]
    with pytest.raises(Exception, match="bad size '4Q'"):
        gloo_comm.parse_sizes("4Q")


def test_bus_factors_match_nccl_tests():
    assert gloo_comm.bus_factor("all_reduce", 4) == 1.5
    assert gloo_comm.bus_factor("all_gather", 4) == 0.75
    assert gloo_comm.bus_factor("reduce_scatter", 8) == 0.875
    assert gloo_comm.bus_factor("broadcast", 8) == 1.0


def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def rec(op, n, size, busbw):
    return json.dumps({"op": op, "nranks": n, "bytes": size, "time_ms": 1.0, "algbw_gbps": 0.0, "busbw_gbps": busbw})


def test_compare_takes_medians_and_ratios(tmp_path):
    t = [write(tmp_path, f"t{i}.jsonl", ["[rank 0] " + rec("all_reduce", 4, 4096, b), "not json", "{broken",
                                        rec("all_reduce", 4, 1 << 20, 10 * b)])
         for i, b in enumerate([1.0, 3.0, 2.0])]
    g = [write(tmp_path, f"g{i}.jsonl", [rec("all_reduce", 4, 4096, b), rec("broadcast", 4, 4096, 5.0)])
         for i, b in enumerate([4.0, 0.5, 1.0, 9.0])]
    rows = compare_comm.compare(compare_comm.read_runs(t), compare_comm.read_runs(g))
    assert rows == [
        ("all_reduce", 4, 4096, 2.0, 2.5, 0.8),           # medians of [1,3,2] and [4,.5,1,9]
        ("all_reduce", 4, 1 << 20, 20.0, None, None),     # gloo has no such size
        ("broadcast", 4, 4096, None, 5.0, None),
    ]
    table = compare_comm.format_table(rows, 3, 4)
    lines = table.splitlines()
    assert lines[1].split() == ["all_reduce", "4", "4K", "2.000", "2.500", "0.80"]
    assert lines[2].split() == ["all_reduce", "4", "1M", "20.000", "-", "-"]
    assert lines[-1] == "busbw, each row the median of its runs in 3 tinyacc and 4 gloo files; GB = 1e9 bytes"


def test_compare_main_sorts_files_by_name(tmp_path, capsys):
    a = write(tmp_path, "tinyacc_1.jsonl", [rec("all_gather", 2, 8192, 4.0)])
    b = write(tmp_path, "gloo_1.jsonl", [rec("all_gather", 2, 8192, 2.0)])
    assert compare_comm.main([a, b]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["all_gather", "2", "8K", "4.000", "2.000", "2.00"]
    c = write(tmp_path, "run.jsonl", [])
    with pytest.raises(SystemExit):
        compare_comm.main([c])
    assert "cannot tell whether" in capsys.readouterr().err


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_gloo_comm_three_ranks(op):
    n, port = 3, free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "gloo_comm.py"), "--op", op, "--sizes", "12K,100K",
             "--iters", "3", "--warmup", "1", "--check", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert outs[1][0] == "" and outs[2][0] == "", "only rank 0 prints results"
    recs = [json.loads(line) for line in outs[0][0].splitlines()]
    per_rank = op in ("all_gather", "reduce_scatter")
    # 100K is not a multiple of 3 floats: the buffer is rounded down to one.
    want_bytes = [12288, (102400 // 12) * 12] if per_rank else [12288, 102400]
    factor = {"all_reduce": 4 / 3, "all_gather": 2 / 3, "reduce_scatter": 2 / 3, "broadcast": 1.0}[op]
    assert [r["bytes"] for r in recs] == want_bytes
    for r in recs:
        assert list(r) == ["op", "nranks", "bytes", "time_ms", "algbw_gbps", "busbw_gbps"]
        assert (r["op"], r["nranks"]) == (op, n)
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_ms"] / 1e3) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
