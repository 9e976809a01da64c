#!/usr/bin/python3
"""Collective bandwidth of PyTorch's gloo backend, as a baseline for tinyacc.

Run one process per rank, under `tinyacc launch` or any launcher that sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT:

    tinyacc launch --nproc 4 -- /usr/bin/python3 bench/gloo_comm.py \
        --op all_reduce --sizes 4K,64K,1M,16M,64M --iters 20 --warmup 5 --json

Numbers follow NVIDIA nccl-tests, so they compare with tinyacc's own bench and
with published results: a size is the full buffer (for all_gather and
reduce_scatter, count x 4 bytes x N), algbw = bytes / time, busbw = algbw x
factor (all_reduce 2(N-1)/N, all_gather and reduce_scatter (N-1)/N,
broadcast 1), GB = 1e9 bytes.

Each iteration is timed alone between barriers; an iteration takes as long as
its slowest rank, and the reported time is the median over iterations, which
a single stall (a page fault, a scheduler hiccup) cannot move.

all_to_all is all_to_all_single; its size is what each rank sends (N blocks of
count x 4 bytes, equal to what it receives) and its busbw factor (N-1)/N, the
share of the buffer that leaves the rank.

torch 1.13's gloo has no reduce_scatter. By default it is timed as the ring
algorithm any bandwidth-optimal library uses (N-1 steps, each sending and
receiving 1/N of the buffer over gloo send/recv, then adding), which moves
exactly the bytes busbw assumes; --no-emulate reports it unsupported instead.
"""

import argparse
import datetime
import json
import os
import re
import sys
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'64K' -> 65536. K, M and G are binary units, as in nccl-tests."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}: use a byte count with an optional K, M or G suffix, e.g. 64K")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def parse_sizes(text):
    return [parse_size(s) for s in text.split(",") if s.strip()]


def bus_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def gloo_has_reduce_scatter():
    """Ask gloo itself rather than trusting a version number."""
    try:
        dist.reduce_scatter(torch.empty(1), [torch.empty(1) for _ in range(dist.get_world_size())])
        return True
    except RuntimeError:
        return False


class RingReduceScatter:
    """Reduce-scatter over point-to-point sends: at step s, rank r sends its
    running sum of block (r-s-1) mod N to rank r+1 and adds what rank r-1 sent
    to its own block (r-s-2) mod N, so after N-1 steps it holds block r summed
    over all ranks. Buffers are allocated once so the loop times only
    communication and the additions a real reduce-scatter also does."""

    def __init__(self, count, n, rank):
        self.n, self.rank = n, rank
        self.recv = torch.empty(count)
        self.acc = [torch.empty(count), torch.empty(count)]

    def __call__(self, out, blocks):
        n, r = self.n, self.rank
        if n == 1:
            out.copy_(blocks[0])
            return
        src = blocks[(r - 1) % n]
        for s in range(n - 1):
            sreq = dist.isend(src, (r + 1) % n)
            rreq = dist.irecv(self.recv, (r - 1) % n)
            rreq.wait()
            sreq.wait()
            dst = self.acc[s % 2]  # the other buffer may still be in flight
            torch.add(self.recv, blocks[(r - s - 2) % n], out=dst)
            src = dst
        out.copy_(src)


def make_op(op, nbytes, n, rank, native_rs, emulate):
    """Returns (run, reset, check, bytes): run() does one collective, reset()
    restores the inputs outside the timed region (an in-place sum would
    otherwise grow to inf), check() verifies the result, bytes is the full
    buffer size the bandwidths are computed from."""
    if op in ("all_reduce", "broadcast"):
        count = nbytes // 4
        x = torch.empty(count)
        full = count * 4

        def reset():
            x.fill_(rank + 1)

        if op == "all_reduce":
            def run():
                dist.all_reduce(x)

            def check():
                return bool(torch.all(x == n * (n + 1) / 2))
        else:
            def run():
                dist.broadcast(x, 0)

            def check():
                return bool(torch.all(x == 1))
        return run, reset, check, full

    count = nbytes // (4 * n)
    full = count * 4 * n
    if op == "all_gather":
        x = torch.full((count,), float(rank + 1))
        outs = [torch.empty(count) for _ in range(n)]

        def run():
            dist.all_gather(outs, x)

        def check():
            return all(bool(torch.all(o == i + 1)) for i, o in enumerate(outs))
        return run, (lambda: None), check, full

    if op == "all_to_all":
        # Block b of rank r holds r*N + b, so block r received here holds
        # r*N + rank.
        inp = (torch.arange(n, dtype=torch.float32) + rank * n).repeat_interleave(count)
        out = torch.empty(count * n)

        def run():
            dist.all_to_all_single(out, inp)

        def check():
            want = torch.arange(n, dtype=torch.float32) * n + rank
            return bool(torch.all(out.view(n, count) == want.view(n, 1)))
        return run, (lambda: None), check, full

    # reduce_scatter: block b of every rank holds b + rank, so block r sums
    # to N*r + N(N-1)/2.
    inp = torch.arange(n, dtype=torch.float32).repeat_interleave(count) + rank
    blocks = list(inp.view(n, count))
    out = torch.empty(count)
    if native_rs:
        def run():
            dist.reduce_scatter(out, blocks)
    elif emulate:
        ring = RingReduceScatter(count, n, rank)

        def run():
            ring(out, blocks)
    else:
        return None

    def check():
        return bool(torch.all(out == n * rank + n * (n - 1) / 2))
    return run, (lambda: None), check, full


def time_op(run, reset, iters, warmup):
    """Median over iterations of the slowest rank's time, in seconds."""
    for _ in range(warmup):
        reset()
        run()
    times = torch.empty(iters, dtype=torch.float64)
    for i in range(iters):
        reset()
        dist.barrier()
        t0 = time.perf_counter()
        run()
        times[i] = time.perf_counter() - t0
    dist.barrier()
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return float(times.median())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=OPS, default="all_reduce")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K,64K,1M,16M,64M"),
                   help="comma-separated full-buffer sizes, K/M/G = KiB/MiB/GiB")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object per size")
    p.add_argument("--check", action="store_true", help="verify each result once before timing")
    p.add_argument("--no-emulate", dest="emulate", action="store_false",
                   help="report reduce_scatter unsupported instead of timing a send/recv ring")
    p.add_argument("--timeout", type=float, default=300, help="seconds before a stuck collective fails")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be at least 1 and --warmup at least 0")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            p.error(f"{key} is not set; run under `tinyacc launch --nproc N -- ...` or set "
                    "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank")

    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    lead = rank == 0
    if lead and not args.json:
        print(f"{'op':<15}{'nranks':>7}{'bytes':>12}{'time_ms':>11}{'algbw_gbps':>12}{'busbw_gbps':>12}")
    native_rs = args.op == "reduce_scatter" and gloo_has_reduce_scatter()
    if lead and args.op == "reduce_scatter" and not native_rs and args.emulate:
        print(f"gloo_comm: gloo in torch {torch.__version__} has no reduce_scatter; "
              "timing a ring of gloo send/recv plus additions instead", file=sys.stderr)
    status = 0
    for size in args.sizes:
        made = make_op(args.op, size, n, rank, native_rs, args.emulate)
        if made is None:
            if lead:
                print(f"gloo_comm: {args.op} is not supported by gloo in torch {torch.__version__}; "
                      "drop --no-emulate to time a send/recv ring instead", file=sys.stderr)
            status = 2
            break
        run, reset, check, full = made
        if full == 0:
            if lead:
                print(f"gloo_comm: size {size} is below one float32 per rank; skipped", file=sys.stderr)
            continue
        if args.check:
            reset()
            run()
            ok = torch.tensor([1 if check() else 0])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if not ok.item():
                if lead:
                    print(f"gloo_comm: {args.op} of {full} bytes gave a wrong result", file=sys.stderr)
                status = 1
                break
        secs = time_op(run, reset, args.iters, args.warmup)
        algbw = full / secs / 1e9
        rec = {"op": args.op, "nranks": n, "bytes": full, "time_ms": secs * 1e3,
               "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(args.op, n)}
        if lead:
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{args.op:<15}{n:>7}{full:>12}{rec['time_ms']:>11.3f}"
                      f"{rec['algbw_gbps']:>12.3f}{rec['busbw_gbps']:>12.3f}", flush=True)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
