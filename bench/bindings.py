"""ms/step of the Python bindings against the CLI on the same config.

    /usr/bin/python3 bench/bindings.py [--steps 20] [--repeats 5] [--config FILE] [--nproc N]

Runs examples/python/train.py and `tinyacc train` alternately (interleaved,
so drifts in machine load hit both), --repeats times each, and prints the
median ms/step of each with their ratio. Python's time is the wall clock of
its training loop (data, forward, backward, step and every ctypes call);
the CLI's is the sum of its per-step times from --metrics_file. Both
exclude start-up and corpus loading. With --nproc N both train
data-parallel on N processes (`tinyacc train --nproc N` against the script
under `tinyacc launch --nproc N`), train.batch_size sequences per rank.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(REPO, "build", "tinyacc")
LIB = os.path.join(REPO, "python", "tinyacc", "libtinyacc.so")
EXAMPLE = os.path.join(REPO, "examples", "python", "train.py")

# The default model of `tinyacc train`; evaluation only after the last step.
DEFAULT_CONFIG = "train:\n  steps: {steps}\n  eval_every: 0\n  eval_batches: 1\n  log_every: 1000\n"


def build():
    subprocess.run(["go", "build", "-o", CLI, "./cmd/tinyacc"], cwd=REPO, check=True)
    subprocess.run(["go", "build", "-buildmode=c-shared", "-o", LIB, "./capi"], cwd=REPO, check=True)
    header = LIB[:-3] + ".h"
    if os.path.exists(header):
        os.remove(header)


def run_cli(cfg, tmp, nproc):
    metrics = os.path.join(tmp, "metrics.jsonl")
    ranks = ["--nproc", str(nproc)] if nproc > 1 else []
    subprocess.run([CLI, "train", "--config", cfg, "--metrics_file", metrics] + ranks, check=True,
                   stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        steps = [json.loads(l) for l in f]
    ms = [s["step_ms"] for s in steps if s["kind"] == "train"]
    return sum(ms) / len(ms)


def run_python(cfg, nproc):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    cmd = [sys.executable, EXAMPLE, "--config", cfg, "--quiet"]
    if nproc > 1:
        cmd = [CLI, "launch", "--nproc", str(nproc), "--"] + cmd
    out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    m = re.search(r"\(([\d.]+) ms/step\)", out)
    if not m:
        raise SystemExit("bench: no ms/step in the example's output:\n" + out)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--config", help="YAML config (default: the CLI's default model)")
    ap.add_argument("--nproc", type=int, default=1, help="data-parallel processes for both")
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    if not args.no_build:
        build()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = args.config
        if cfg is None:
            cfg = os.path.join(tmp, "bench.yaml")
            with open(cfg, "w") as f:
                f.write(DEFAULT_CONFIG.format(steps=args.steps))
        py, cli = [], []
        for r in range(args.repeats):
            # Alternate which goes first so neither always runs warm.
            order = [("cli", lambda: run_cli(cfg, tmp, args.nproc)), ("python", lambda: run_python(cfg, args.nproc))]
            if r % 2:
                order.reverse()
            for name, fn in order:
                (cli if name == "cli" else py).append(fn())
    mp, mc = statistics.median(py), statistics.median(cli)
    print("%d process(es)" % args.nproc)
    print("%-28s %12s %12s" % ("", "ms/step", "runs"))
    print("%-28s %12.2f %12s" % ("tinyacc train (CLI)", mc, " ".join("%.1f" % v for v in cli)))
    print("%-28s %12.2f %12s" % ("examples/python/train.py", mp, " ".join("%.1f" % v for v in py)))
    print("python / CLI: %.4f (%+.2f%%)" % (mp / mc, 100 * (mp / mc - 1)))


if __name__ == "__main__":
    main()
