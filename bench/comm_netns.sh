#!/usr/bin/env bash
# make bench-comm-netns (root): tinyacc's tcp backend across a host boundary
# against the same job on one host. Four ranks are two "hosts" of two
# (TINYACC_HOST_ID hostA and hostB), so in both layouts ranks 0-1 and 2-3
# share memory and every other pair talks TCP:
#   across  hostB's ranks run in a second network namespace, reached over a
#           veth pair (10.200.0.1 <-> 10.200.0.2, addresses that exist only
#           inside the two namespaces this script creates);
#   within  all four ranks run in the first namespace, the TCP pairs on its
#           own stack.
# The layouts take turns, REPEATS times per op, and bench/compare_comm.py
# prints per-size median busbw side by side with across/within. The
# namespaces (and with them the link) and every rank are removed however the
# script ends.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/tinyacc}
PYTHON=${PYTHON:-/usr/bin/python3}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-1M,4M,16M,64M}
OPS=${OPS:-all_reduce all_gather}
TIMEOUT=${TIMEOUT:-60s}

if [ "$(id -u)" != 0 ]; then
  echo "comm_netns.sh: needs root to create network namespaces" >&2
  exit 1
fi
if ! command -v ip > /dev/null; then
  echo "comm_netns.sh: needs the ip command (Debian: apt-get install iproute2)" >&2
  exit 1
fi
BIN=$(realpath "$BIN")

tag=$$
nsA=tinyacc-bench-$tag-a
nsB=tinyacc-bench-$tag-b
linkA=tab${tag}a
linkB=tab${tag}b
out=$(mktemp -d)
pids=()
made=()

cleanup() {
  local p ns
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
  for ns in "${made[@]}"; do ip netns delete "$ns" 2> /dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for ns in "$nsA" "$nsB"; do
  ip netns add "$ns"
  made+=("$ns")
done
ip link add "$linkA" netns "$nsA" type veth peer name "$linkB" netns "$nsB"
ip -n "$nsA" addr add 10.200.0.1/24 dev "$linkA"
ip -n "$nsB" addr add 10.200.0.2/24 dev "$linkB"
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" link set "$linkA" up
ip -n "$nsB" link set "$linkB" up

# Threads per rank as `tinyacc launch` shares them: the cores over 4 ranks.
threads=$(($(nproc) / 4))
[ "$threads" -ge 1 ] || threads=1
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
port=29500

# run LAYOUT OP FILE: one run of every size, rank 0's JSON lines into FILE.
run() {
  local layout=$1 op=$2 file=$3 r ns host failed=""
  port=$((port + 1))
  pids=()
  for r in 0 1 2 3; do
    ns=$nsA host=hostA
    if [ "$r" -ge 2 ]; then
      host=hostB
      if [ "$layout" = across ]; then ns=$nsB; fi
    fi
    ip netns exec "$ns" env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR=10.200.0.1 MASTER_PORT=$port TINYACC_JOB_TOKEN="$token" TINYACC_HOST_ID=$host \
      TINYACC_COMM_TIMEOUT="$TIMEOUT" OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads GOMAXPROCS=$threads \
      "$BIN" bench comm --backend tcp --op "$op" --sizes "$SIZES" --json \
      > "$file.$r.out" 2> "$file.$r.err" &
    pids+=($!)
  done
  for r in 0 1 2 3; do
    wait "${pids[$r]}" || failed="$failed $r"
  done
  pids=()
  if [ -n "$failed" ]; then
    echo "comm_netns.sh: $layout $op: ranks$failed failed:" >&2
    for r in $failed; do sed "s/^/[rank $r] /" "$file.$r.err" >&2; done
    exit 1
  fi
  mv "$file.0.out" "$file"
}

layouts=(across within)
for op in $OPS; do
  for r in $(seq 1 "$REPEATS"); do
    for i in 0 1; do
      l=${layouts[$(((r - 1 + i) % 2))]}
      echo "run $r/$REPEATS: $op $l" >&2
      run "$l" "$op" "$out/$l-$op-$r.jsonl"
    done
  done
done

echo "tcp, 4 ranks as 2 hosts x 2: across = the hosts in two network namespaces joined by a veth pair, within = both in one"
"$PYTHON" bench/compare_comm.py --runs across "$out"/across-*.jsonl --runs within "$out"/within-*.jsonl --peer within
