#!/usr/bin/env bash
# make bench-comm: tinyacc's tcp backend against torch.distributed gloo, 4
# local ranks each, all-reduce and all-gather. The two sides run one after
# the other, REPEATS times (interleaved, since gloo alone varies by ±10% run
# to run here); bench/compare_comm.py prints per-size medians side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tinyacc}
PYTHON=${PYTHON:-/usr/bin/python3}
NPROC=${NPROC:-4}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-4K,64K,1M,16M,64M}
OPS=${OPS:-all_reduce all_gather}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for op in $OPS; do
  for r in $(seq 1 "$REPEATS"); do
    echo "run $r/$REPEATS: $op" >&2
    "$BIN" bench comm --nproc "$NPROC" --backend tcp --op "$op" --sizes "$SIZES" --json > "$out/tinyacc-$op-$r.jsonl"
    "$BIN" launch --nproc "$NPROC" -- "$PYTHON" bench/gloo_comm.py --op "$op" --sizes "$SIZES" --json \
      > "$out/gloo-$op-$r.jsonl" 2> "$out/gloo-$op-$r.err" || { cat "$out/gloo-$op-$r.err" >&2; exit 1; }
  done
done
"$PYTHON" bench/compare_comm.py --tinyacc "$out"/tinyacc-*.jsonl --gloo "$out"/gloo-*.jsonl
