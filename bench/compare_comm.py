#!/usr/bin/python3
"""Side-by-side collective bandwidth of tinyacc and gloo.

    bench/compare_comm.py --tinyacc t1.jsonl t2.jsonl t3.jsonl \
                          --gloo g1.jsonl g2.jsonl g3.jsonl

Each file is one run: JSON lines with at least op, nranks, bytes and
busbw_gbps, as written by `tinyacc bench` and bench/gloo_comm.py --json
(lines prefixed by the launcher, "[rank 0] {...}", and non-JSON lines are
accepted). Runs of the two should be interleaved (t1 g1 t2 g2 ...) so that a
slow spell of the machine hits both; the table shows, per op, rank count and
size, the median busbw of each side over all its runs, and tinyacc/gloo.

Files may also be given without flags when their names say which side they
belong to (containing "tinyacc" or "gloo").
"""

import argparse
import json
import os
import re
import statistics
import sys

PREFIX = re.compile(r"^\[rank \d+\]\s*")
REQUIRED = ("op", "nranks", "bytes", "busbw_gbps")


def read_runs(paths):
    """Returns {(op, nranks, bytes): [busbw, ...]} over all files."""
    samples = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = PREFIX.sub("", line.strip())
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not all(k in rec for k in REQUIRED):
                    continue
                key = (rec["op"], int(rec["nranks"]), int(rec["bytes"]))
                samples.setdefault(key, []).append(float(rec["busbw_gbps"]))
    return samples


def human_size(n):
    """65536 -> '64K': binary units, as the benchmarks' --sizes take them."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def compare(tinyacc, gloo):
    """Rows (op, nranks, bytes, tinyacc median, gloo median, ratio), sorted;
    a side with no samples for a row has None, and then so has the ratio."""
    rows = []
    for key in sorted(set(tinyacc) | set(gloo)):
        t = statistics.median(tinyacc[key]) if key in tinyacc else None
        g = statistics.median(gloo[key]) if key in gloo else None
        ratio = t / g if t is not None and g else None
        rows.append((*key, t, g, ratio))
    return rows


def format_table(rows, runs_t, runs_g):
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    out = [f"{'op':<15}{'nranks':>7}{'size':>8}{'tinyacc GB/s':>14}{'gloo GB/s':>12}{'tinyacc/gloo':>14}"]
    for op, n, size, t, g, ratio in rows:
        out.append(f"{op:<15}{n:>7}{human_size(size):>8}{num(t, '.3f'):>14}{num(g, '.3f'):>12}{num(ratio, '.2f'):>14}")
    out.append(f"busbw, each row the median of its runs in {runs_t} tinyacc and {runs_g} gloo files; GB = 1e9 bytes")
    return "\n".join(out)


def split_by_name(paths):
    t, g = [], []
    for p in paths:
        name = os.path.basename(p).lower()
        if "gloo" in name:
            g.append(p)
        elif "tinyacc" in name:
            t.append(p)
        else:
            raise ValueError(f"cannot tell whether {p} is a tinyacc or a gloo run; "
                             "pass it after --tinyacc or --gloo")
    return t, g


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tinyacc", nargs="+", default=[], metavar="FILE", help="tinyacc runs (JSON lines)")
    p.add_argument("--gloo", nargs="+", default=[], metavar="FILE", help="gloo runs (JSON lines)")
    p.add_argument("files", nargs="*", help="runs whose file names contain 'tinyacc' or 'gloo'")
    args = p.parse_args(argv)
    try:
        t_named, g_named = split_by_name(args.files)
    except ValueError as e:
        p.error(str(e))
    t_paths, g_paths = args.tinyacc + t_named, args.gloo + g_named
    if not t_paths and not g_paths:
        p.error("no runs given; use --tinyacc FILE... --gloo FILE...")
    rows = compare(read_runs(t_paths), read_runs(g_paths))
    if not rows:
        print("compare_comm: no result lines (JSON with op, nranks, bytes, busbw_gbps) in the files",
              file=sys.stderr)
        return 1
    print(format_table(rows, len(t_paths), len(g_paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
