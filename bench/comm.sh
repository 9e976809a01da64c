#!/usr/bin/env bash
# make bench-comm: collective bandwidth on one host, side by side: tinyacc
# (its tcp backend, which moves the collectives of ranks on one host through
# shared memory), Open MPI (tinyacc's mpi backend, which hands every
# collective to the MPI library under mpirun, with its default shared-memory
# transport) and torch.distributed's gloo; all_reduce, all_gather,
# reduce_scatter, broadcast and all_to_all (gloo: all_to_all_single) at every
# size and rank count, plus a memcpy
# row (every rank copying a buffer of the size at once, measured by the same
# command) as the memory's own bandwidth. The backends take turns, REPEATS
# times per op and rank count (each repeat starting with the next backend,
# since this host varies run to run); bench/compare_comm.py prints per-size
# median busbw side by side and tinyacc's ratio against each other side.
# The openmpi column needs mpirun on PATH; without it the table has none and
# says so.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tinyacc}
PYTHON=${PYTHON:-/usr/bin/python3}
NPROCS=${NPROCS:-2 4}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-64K,1M,4M,16M,64M}
OPS=${OPS:-all_reduce all_gather reduce_scatter broadcast all_to_all}
BACKENDS=${BACKENDS:-tinyacc openmpi gloo}

absent=""
backends=()
for b in $BACKENDS; do
  case $b in
    tinyacc | gloo) backends+=("$b") ;;
    openmpi)
      if command -v mpirun > /dev/null; then
        backends+=(openmpi)
      else
        absent="openmpi: not measured, mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)"
      fi
      ;;
    *) echo "comm.sh: BACKENDS: unknown backend '$b' (use tinyacc, openmpi and gloo)" >&2; exit 2 ;;
  esac
done
case " ${backends[*]} " in
  *" tinyacc "*) ;;
  *) echo "comm.sh: BACKENDS must include tinyacc, the side the others are compared with" >&2; exit 2 ;;
esac

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run BACKEND NPROC OP FILE: one run of every size, JSON lines into FILE.
run() {
  local err="$4.err"
  case $1 in
    tinyacc) "$BIN" bench comm --nproc "$2" --backend tcp --op "$3" --sizes "$SIZES" --json > "$4" 2> "$err" ;;
    openmpi) "$BIN" bench comm --nproc "$2" --backend mpi --op "$3" --sizes "$SIZES" --json > "$4" 2> "$err" ;;
    gloo) "$BIN" launch --nproc "$2" -- "$PYTHON" bench/gloo_comm.py --op "$3" --sizes "$SIZES" --json > "$4" 2> "$err" ;;
  esac || { echo "comm.sh: $1 $3 on $2 ranks failed:" >&2; cat "$err" >&2; exit 1; }
}

n=${#backends[@]}
for np in $NPROCS; do
  for op in $OPS; do
    for r in $(seq 1 "$REPEATS"); do
      for i in $(seq 0 $((n - 1))); do
        b=${backends[$(((r - 1 + i) % n))]}
        echo "run $r/$REPEATS: $op on $np ranks, $b" >&2
        run "$b" "$np" "$op" "$out/$b-$np-$op-$r.jsonl"
      done
    done
  done
  for r in $(seq 1 "$REPEATS"); do
    echo "run $r/$REPEATS: memcpy on $np ranks" >&2
    run tinyacc "$np" memcpy "$out/tinyacc-$np-memcpy-$r.jsonl"
  done
done

args=()
for b in "${backends[@]}"; do
  args+=(--runs "$b")
  for f in "$out/$b"-*.jsonl; do args+=("$f"); done
done
echo "ranks on one host; tinyacc is its tcp backend (shared memory within a host), openmpi tinyacc's mpi backend"
echo "(Open MPI's own collectives under mpirun), gloo torch.distributed's; memcpy: every rank copying at once"
"$PYTHON" bench/compare_comm.py "${args[@]}" --subject tinyacc
if [ -n "$absent" ]; then echo "$absent"; fi
