"""Tests for gloo_comm.py and compare_comm.py: /usr/bin/python3 -m pytest bench/"""

import json
import os
import shutil
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
    sides = [("tinyacc", compare_comm.read_runs(t)), ("gloo", compare_comm.read_runs(g))]
    table = compare_comm.format_sides(compare_comm.compare_sides(sides, "gloo"), ["tinyacc", "gloo"], "gloo")
    lines = table.splitlines()
    assert lines[0].split() == ["op", "nranks", "size", "tinyacc", "GB/s", "gloo", "GB/s", "tinyacc/gloo"]
    assert lines[1].split() == ["all_reduce", "4", "4K", "2.000", "2.500", "0.80"]
    assert lines[2].split() == ["all_reduce", "4", "1M", "20.000", "-", "-"]
    assert lines[-1] == "busbw, each row the median of 3 tinyacc and 4 gloo runs; GB = 1e9 bytes"


def test_compare_sides_ratios_against_the_peer(tmp_path):
    tcp = [write(tmp_path, f"tcp{i}.jsonl", [rec("all_gather", 4, 1 << 20, b), rec("all_gather", 4, 4 << 20, 2 * b)])
           for i, b in enumerate([2.0, 4.0, 3.0])]
    mpi = [write(tmp_path, f"mpi{i}.jsonl", [rec("all_gather", 4, 1 << 20, b)]) for i, b in enumerate([1.0, 5.0])]
    gloo = [write(tmp_path, f"gloo{i}.jsonl", [rec("all_gather", 4, 1 << 20, 1.5)]) for i in range(3)]
    sides = [(name, compare_comm.read_runs(files)) for name, files in (("tcp", tcp), ("mpi", mpi), ("gloo", gloo))]
    rows = compare_comm.compare_sides(sides, "gloo")
    assert rows == [
        ("all_gather", 4, 1 << 20, [3.0, 3.0, 1.5], [2.0, 2.0], [3, 2, 3]),
        ("all_gather", 4, 4 << 20, [6.0, None, None], [None, None], [3, 0, 0]),  # no peer: no ratios
    ]
    # Against mpi, the other two sides get the ratios, in their order.
    assert compare_comm.compare_sides(sides, "mpi")[0][4] == [1.0, 0.5]
    lines = compare_comm.format_sides(rows, ["tcp", "mpi", "gloo"], "gloo").splitlines()
    assert lines[0].split() == ["op", "nranks", "size", "tcp", "GB/s", "mpi", "GB/s", "gloo", "GB/s",
                                "tcp/gloo", "mpi/gloo"]
    assert lines[1].split() == ["all_gather", "4", "1M", "3.000", "3.000", "1.500", "2.00", "2.00"]
    assert lines[2].split() == ["all_gather", "4", "4M", "6.000", "-", "-", "-", "-"]
    assert lines[3] == "busbw, each row the median of 3 tcp, 2 mpi and 3 gloo runs; GB = 1e9 bytes"
    with pytest.raises(ValueError, match="peer 'nccl' is none of the sides \\(tcp, mpi, gloo\\)"):
        compare_comm.compare_sides(sides, "nccl")


def test_compare_main_runs_and_peer(tmp_path, capsys):
    a = write(tmp_path, "a.jsonl", [rec("all_reduce", 4, 1 << 20, 3.0)])
    b = write(tmp_path, "b.jsonl", [rec("all_reduce", 4, 1 << 20, 2.0)])
    c = write(tmp_path, "c.jsonl", [rec("all_reduce", 4, 1 << 20, 6.0)])
    assert compare_comm.main(["--runs", "across", a, "--runs", "within", b, c]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "across/within"  # the last side is the peer unless named
    assert lines[1].split() == ["all_reduce", "4", "1M", "3.000", "4.000", "0.75"]
    assert lines[2] == "busbw, each row the median of 1 across and 2 within runs; GB = 1e9 bytes"
    assert compare_comm.main(["--runs", "across", a, "--runs", "within", b, "--peer", "across"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[-1] == "within/across"
    for argv, msg in [
        (["--runs", "x", a, "--runs", "y", b, "--peer", "z"], "peer 'z' is none of the sides (x, y)"),
        (["--runs", "x", a, "--runs", "x", b], "--runs x is given twice"),
        (["--runs", "x"], "--runs x: no files"),
        (["--runs", "x", a, "--gloo", b], "--runs cannot be mixed"),
    ]:
        with pytest.raises(SystemExit):
            compare_comm.main(argv)
        assert msg in capsys.readouterr().err


def test_compare_main_sorts_files_by_name(tmp_path, capsys):
    a = write(tmp_path, "tinyacc_1.jsonl", [rec("all_gather", 2, 8192, 4.0)])
    b = write(tmp_path, "gloo_1.jsonl", [rec("all_gather", 2, 8192, 2.0)])
    assert compare_comm.main([a, b]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["all_gather", "2", "8K", "4.000", "2.000", "2.00"]
    c = write(tmp_path, "run.jsonl", [])
    with pytest.raises(SystemExit):
        compare_comm.main([c])
    assert "cannot tell whether" in capsys.readouterr().err


FAKE_TINYACC = """#!/usr/bin/python3
# Stands in for build/tinyacc in comm.sh: logs each run and prints busbw
# that says which backend, op and size it came from.
import json, os, sys
argv = sys.argv[1:]
def flag(name, args):
    return args[args.index(name) + 1]
if argv[0] == "launch":
    cmd = argv[argv.index("--") + 1:]
    assert cmd[1] == "bench/gloo_comm.py", cmd
    backend, args, prefix = "gloo", cmd, "[rank 0] "
else:
    assert argv[:2] == ["bench", "comm"], argv
    backend, args, prefix = flag("--backend", argv), argv, ""
op, nproc = flag("--op", args), int(flag("--nproc", argv))
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"{backend} {nproc} {op}\\n")
base = 10.0 if op == "memcpy" else {"tcp": 2.0, "mpi": 3.0, "gloo": 1.0}[backend]
for size in flag("--sizes", args).split(","):
    mib = int(size[:-1])
    print(prefix + json.dumps({"op": op, "nranks": nproc, "bytes": mib << 20, "busbw_gbps": base * mib}))
"""


def run_comm_sh(tmp_path, with_mpirun, **env):
    """Runs bench/comm.sh with a fake tinyacc, on a PATH with only the tools
    it needs (and a stand-in mpirun when asked); returns stdout and the log
    of runs in order."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("dirname", "mktemp", "rm", "seq", "cat"):
        os.symlink(shutil.which(tool), bindir / tool)
    if with_mpirun:
        os.symlink(shutil.which("true"), bindir / "mpirun")
    fake = tmp_path / "tinyacc"
    fake.write_text(FAKE_TINYACC)
    fake.chmod(0o755)
    log = tmp_path / "runs.log"
    env = dict(PATH=str(bindir), BIN=str(fake), PYTHON=sys.executable, FAKE_LOG=str(log), **env)
    res = subprocess.run(["/bin/bash", os.path.join(HERE, "comm.sh")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout, log.read_text().splitlines()


def test_comm_sh_interleaves_backends_in_one_table(tmp_path):
    out, runs = run_comm_sh(tmp_path, True, REPEATS="2", SIZES="1M,4M", OPS="all_reduce all_gather")
    # Each repeat starts with the next backend; every rank count ends with
    # the memcpy runs.
    per_np = lambda n: [f"tcp {n} all_reduce", f"mpi {n} all_reduce", f"gloo {n} all_reduce",
                        f"mpi {n} all_reduce", f"gloo {n} all_reduce", f"tcp {n} all_reduce",
                        f"tcp {n} all_gather", f"mpi {n} all_gather", f"gloo {n} all_gather",
                        f"mpi {n} all_gather", f"gloo {n} all_gather", f"tcp {n} all_gather",
                        f"tcp {n} memcpy", f"tcp {n} memcpy"]
    assert runs == per_np(2) + per_np(4)
    lines = out.splitlines()
    assert lines[0].startswith("ranks on one host; tinyacc is its tcp backend")
    assert lines[2].split() == ["op", "nranks", "size", "tinyacc", "GB/s", "openmpi", "GB/s", "gloo", "GB/s",
                                "tinyacc/openmpi", "tinyacc/gloo"]
    rows = [ln.split() for ln in lines[3:-1]]
    assert rows[:2] == [["all_gather", "2", "1M", "2.000", "3.000", "1.000", "0.67", "2.00"],
                        ["all_gather", "2", "4M", "8.000", "12.000", "4.000", "0.67", "2.00"]]
    assert rows[4] == ["all_reduce", "2", "1M", "2.000", "3.000", "1.000", "0.67", "2.00"]
    assert rows[8:] == [["memcpy", "2", "1M", "10.000", "-", "-", "-", "-"],
                        ["memcpy", "2", "4M", "40.000", "-", "-", "-", "-"],
                        ["memcpy", "4", "1M", "10.000", "-", "-", "-", "-"],
                        ["memcpy", "4", "4M", "40.000", "-", "-", "-", "-"]]
    assert lines[-1] == "busbw, each row the median of 2 tinyacc, 2 openmpi and 2 gloo runs; GB = 1e9 bytes"


def test_comm_sh_without_mpirun_says_so(tmp_path):
    out, runs = run_comm_sh(tmp_path, False, REPEATS="1", SIZES="1M", OPS="all_reduce", NPROCS="4")
    assert runs == ["tcp 4 all_reduce", "gloo 4 all_reduce", "tcp 4 memcpy"]
    lines = out.splitlines()
    assert lines[2].split() == ["op", "nranks", "size", "tinyacc", "GB/s", "gloo", "GB/s", "tinyacc/gloo"]
    assert lines[3].split() == ["all_reduce", "4", "1M", "2.000", "1.000", "2.00"]
    assert lines[-1].startswith("openmpi: not measured, mpirun is not on PATH")


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
