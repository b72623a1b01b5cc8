#!/usr/bin/env bash
# fp16 compression against none, through the engine, between two hosts
# made of network namespaces joined by a veth pair whose both ends are
# shaped to RATE (tc's token bucket): one kolo-bench rank per host over
# UCX's TCP, rounds alternating which goes first, 64 MiB f32 allreduces
# by default. Needs root, iproute2 (ip, tc) and python3; the namespaces
# are removed at the end, also on failure.
#
#   cargo build --release -p kolo-bench --features ucx -p kolo-run
#   bash benches/compression-netns.sh target/release 3 1gbit 64M    # BIN ROUNDS RATE SIZE
#
# Prints every row ("none|fp16 ROUND size count type redop time ...") and
# the median step time of each, with fp16's speed-up.
set -euo pipefail
bin=$1 rounds=${2:-3} rate=${3:-1gbit} size=${4:-64M}
id=$$
. "$(dirname "$0")/shaped-hosts.sh"
shaped_hosts kcmp 78 "$rate"
port=$((29000 + $$ % 1000)) token=compression-$id
run() { # compression round
  local node ns pids=()
  for node in 0 1; do
    ns=$a; [ "$node" = 1 ] && ns=$b
    KOLO_RENDEZVOUS_TOKEN=$token UCX_TLS=tcp,self \
      ip netns exec "$ns" "$bin/kolo-run" --nnodes 2 --node-rank "$node" --master-addr "$net.1" \
      --master-port "$port" -n 1 "$bin/kolo-bench" --backend ucx --engine --op allreduce \
      --min-bytes "$size" --max-bytes "$size" --iters 5 --warmup 1 --no-check --quiet \
      --compression "$1" > "/tmp/compression-$id-$node.out" 2>/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
  grep -v '^#' "/tmp/compression-$id-0.out" | sed "s/^/$1 $2 /"
}
rows=$(for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then run none "$r"; run fp16 "$r"; else run fp16 "$r"; run none "$r"; fi
done)
echo "$rows"
echo "$rows" | python3 -c '
import statistics, sys
times = {}
for line in sys.stdin:
    p = line.split()
    if len(p) >= 7 and p[2].isdigit():
        times.setdefault(p[0], []).append(float(p[6]))
none, fp16 = statistics.median(times["none"]), statistics.median(times["fp16"])
rounds = len(times["none"])
print(f"'"$size"' f32 allreduce between two hosts shaped to '"$rate"', medians of {rounds} rounds:")
print(f"  none {none / 1e3:.1f} ms, fp16 {fp16 / 1e3:.1f} ms: fp16 {none / fp16:.2f}x faster")
'
