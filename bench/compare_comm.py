#!/usr/bin/python3
"""Side-by-side collective bandwidth of several backends.

    bench/compare_comm.py --runs tcp t1.jsonl t2.jsonl --runs mpi m1.jsonl m2.jsonl \
                          --runs gloo g1.jsonl g2.jsonl --peer gloo

Each file is one run: JSON lines with at least op, nranks, bytes and
busbw_gbps, as written by `tinyacc bench comm --json` and bench/gloo_comm.py
--json (lines prefixed by the launcher, "[rank 0] {...}", and non-JSON lines
are accepted). --runs NAME FILE... gives one side (a column) and the files
of its runs; runs of the sides should be interleaved (t1 m1 g1 t2 m2 g2 ...)
so that a slow spell of the machine hits all of them. The table shows, per
op, rank count and size, the median busbw of each side over all its runs,
then each other side's median divided by the peer's (--peer, by default the
last side).

The older form, --tinyacc FILE... --gloo FILE... (or files whose names
contain "tinyacc" or "gloo"), compares the two with gloo as the peer.
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


def compare_sides(sides, peer):
    """sides is [(name, samples), ...] with samples as read_runs returns
    them; peer is one of the names. Rows (op, nranks, bytes, medians,
    ratios, runs), sorted: medians has one entry per side, in order; ratios
    one per side other than the peer, that side's median over the peer's;
    runs the number of samples behind each median. A side with no samples
    for a row has None, and then so has its ratio."""
    names = [name for name, _ in sides]
    if peer not in names:
        raise ValueError(f"peer {peer!r} is none of the sides ({', '.join(names)})")
    keys = set()
    for _, samples in sides:
        keys |= set(samples)
    p = names.index(peer)
    rows = []
    for key in sorted(keys):
        medians = [statistics.median(s[key]) if key in s else None for _, s in sides]
        base = medians[p]
        ratios = [m / base if m is not None and base else None
                  for i, m in enumerate(medians) if i != p]
        runs = [len(s.get(key, ())) for _, s in sides]
        rows.append((*key, medians, ratios, runs))
    return rows


def format_sides(rows, names, peer):
    """The table of compare_sides' rows, for sides called names."""
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    heads = [f"{n} GB/s" for n in names] + [f"{n}/{peer}" for n in names if n != peer]
    widths = [max(len(h) + 2, 10) for h in heads]
    out = [f"{'op':<15}{'nranks':>7}{'size':>8}" + "".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
    for op, n, size, medians, ratios, _ in rows:
        cells = [num(m, ".3f") for m in medians] + [num(r, ".2f") for r in ratios]
        out.append(f"{op:<15}{n:>7}{human_size(size):>8}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    counts = []
    for i, name in enumerate(names):
        seen = [row[5][i] for row in rows if row[5][i]]
        lo, hi = (min(seen), max(seen)) if seen else (0, 0)
        counts.append(f"{lo} {name}" if lo == hi else f"{lo}-{hi} {name}")
    runs = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
    out.append(f"busbw, each row the median of {runs} runs; GB = 1e9 bytes")
    return "\n".join(out)


def subject_rows(rows, names, subject):
    """compare_sides' rows (computed with subject as the peer) with the
    ratios turned around: subject's median over each other side's."""
    out = []
    for op, n, size, medians, _, runs in rows:
        base = medians[names.index(subject)]
        ratios = [base / m if base is not None and m else None
                  for name, m in zip(names, medians) if name != subject]
        out.append((op, n, size, medians, ratios, runs))
    return out


def format_subject(rows, names, subject):
    """The table of subject_rows: ratio columns subject/other."""
    table = format_sides(rows, names, subject).splitlines()
    for other in names:
        if other != subject:
            table[0] = table[0].replace(f"{other}/{subject}", f"{subject}/{other}".rjust(len(f"{other}/{subject}")), 1)
    return "\n".join(table)


def compare(tinyacc, gloo):
    """Rows (op, nranks, bytes, tinyacc median, gloo median, ratio), sorted;
    a side with no samples for a row has None, and then so has the ratio."""
    return [(op, n, size, *medians, *ratios)
            for op, n, size, medians, ratios, _ in compare_sides([("tinyacc", tinyacc), ("gloo", gloo)], "gloo")]


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
    p.add_argument("--runs", nargs="+", action="append", default=[], metavar=("NAME", "FILE"),
                   help="one side: its name, then the files of its runs (JSON lines); repeat per side")
    p.add_argument("--peer", help="the side the others are divided by (default: the last --runs)")
    p.add_argument("--subject", help="instead of --peer: the side divided by each other side")
    p.add_argument("--tinyacc", nargs="+", default=[], metavar="FILE", help="tinyacc runs (JSON lines)")
    p.add_argument("--gloo", nargs="+", default=[], metavar="FILE", help="gloo runs (JSON lines)")
    p.add_argument("files", nargs="*", help="runs whose file names contain 'tinyacc' or 'gloo'")
    args = p.parse_args(argv)
    if args.runs:
        if args.tinyacc or args.gloo or args.files:
            p.error("--runs cannot be mixed with --tinyacc, --gloo or bare files")
        sides = []
        for name, *paths in args.runs:
            if not paths:
                p.error(f"--runs {name}: no files; give the side's name, then its run files")
            if name in (n for n, _ in sides):
                p.error(f"--runs {name} is given twice; put all of a side's files after one --runs")
            sides.append((name, paths))
        peer = args.peer or sides[-1][0]
    else:
        try:
            t_named, g_named = split_by_name(args.files)
        except ValueError as e:
            p.error(str(e))
        t_paths, g_paths = args.tinyacc + t_named, args.gloo + g_named
        if not t_paths and not g_paths:
            p.error("no runs given; use --runs NAME FILE... (once per side), or --tinyacc FILE... --gloo FILE...")
        sides, peer = [("tinyacc", t_paths), ("gloo", g_paths)], args.peer or "gloo"
    names = [name for name, _ in sides]
    if args.subject:
        peer = args.subject
    try:
        rows = compare_sides([(name, read_runs(paths)) for name, paths in sides], peer)
    except ValueError as e:
        p.error(f"--{'subject' if args.subject else 'peer'}: {e}")
    if not rows:
        print("compare_comm: no result lines (JSON with op, nranks, bytes, busbw_gbps) in the files",
              file=sys.stderr)
        return 1
    if args.subject:
        print(format_subject(subject_rows(rows, names, peer), names, peer))
    else:
        print(format_sides(rows, names, peer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
