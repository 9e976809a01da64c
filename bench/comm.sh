#!/usr/bin/env bash
# make bench-comm: collective bandwidth of tinyacc's tcp and mpi backends and
# of torch.distributed's gloo, 4 local ranks each, all-reduce and all-gather,
# in one table. The backends take turns, REPEATS times per op (each repeat
# starting with the next backend, since gloo alone varies by ±10% run to run
# here); bench/compare_comm.py prints per-size median busbw side by side and
# each backend's ratio against PEER. The mpi column needs mpirun on PATH;
# without it the table has none and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tinyacc}
PYTHON=${PYTHON:-/usr/bin/python3}
NPROC=${NPROC:-4}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-1M,4M,16M,64M}
OPS=${OPS:-all_reduce all_gather}
BACKENDS=${BACKENDS:-tcp mpi gloo}
PEER=${PEER:-gloo}

absent=""
backends=()
for b in $BACKENDS; do
  case $b in
    tcp | gloo) backends+=("$b") ;;
    mpi)
      if command -v mpirun > /dev/null; then
        backends+=(mpi)
      else
        absent="mpi: not measured, mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)"
      fi
      ;;
    *) echo "comm.sh: BACKENDS: unknown backend '$b' (use tcp, mpi and gloo)" >&2; exit 2 ;;
  esac
done
case " ${backends[*]} " in
  *" $PEER "*) ;;
  *) echo "comm.sh: PEER=$PEER is not among the backends measured (${backends[*]})" >&2; exit 2 ;;
esac

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run BACKEND OP FILE: one run of every size, JSON lines into FILE.
run() {
  local err="$3.err"
  case $1 in
    tcp | mpi) "$BIN" bench comm --nproc "$NPROC" --backend "$1" --op "$2" --sizes "$SIZES" --json > "$3" 2> "$err" ;;
    gloo) "$BIN" launch --nproc "$NPROC" -- "$PYTHON" bench/gloo_comm.py --op "$2" --sizes "$SIZES" --json > "$3" 2> "$err" ;;
  esac || { echo "comm.sh: $1 $2 failed:" >&2; cat "$err" >&2; exit 1; }
}

n=${#backends[@]}
for op in $OPS; do
  for r in $(seq 1 "$REPEATS"); do
    for i in $(seq 0 $((n - 1))); do
      b=${backends[$(((r - 1 + i) % n))]}
      echo "run $r/$REPEATS: $op $b" >&2
      run "$b" "$op" "$out/$b-$op-$r.jsonl"
    done
  done
done

args=()
for b in "${backends[@]}"; do
  args+=(--runs "$b")
  for f in "$out/$b"-*.jsonl; do args+=("$f"); done
done
echo "$NPROC ranks on one host; tcp and mpi are tinyacc's backends, gloo is torch.distributed's"
"$PYTHON" bench/compare_comm.py "${args[@]}" --peer "$PEER"
if [ -n "$absent" ]; then echo "$absent"; fi
