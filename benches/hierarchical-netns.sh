#!/usr/bin/env bash
# The hierarchical allreduce (KOLO_HIERARCHICAL_ALLREDUCE=1) against the
# flat ring, through the engine, between two hosts made of network
# namespaces joined by a veth pair whose both ends are shaped to RATE
# (tc's token bucket): two kolo-bench ranks per host (kolo-run --nnodes 2
# -n 2) over UCX's TCP alone (so that every byte between the hosts takes
# the shaped link), rounds alternating which goes first, f32 sum
# allreduces of each SIZE. Needs root, iproute2 (ip, tc) and python3; the
# namespaces are removed at the end, also on failure.
#
#   cargo build --release -p kolo-bench --features ucx -p kolo-run
#   bash benches/hierarchical-netns.sh target/release 3 1gbit 16M,64M    # BIN ROUNDS RATE SIZES
#
# Prints every row ("flat|hier ROUND size count type redop time ...
# #wrong") and the median time of each size, with the hierarchical one's
# speed-up.
set -euo pipefail
bin=$1 rounds=${2:-3} rate=${3:-1gbit} sizes=${4:-16M,64M}
id=$$
out=$(mktemp -d)
CLEANUP_EXTRA="rm -rf $out"
. "$(dirname "$0")/shaped-hosts.sh"
shaped_hosts khier 79 "$rate"
port=$((29000 + $$ % 1000)) token=hierarchical-$id
run() { # mode round size
  local node ns hier="" pids=()
  [ "$1" = hier ] && hier=1
  for node in 0 1; do
    ns=$a; [ "$node" = 1 ] && ns=$b
    KOLO_RENDEZVOUS_TOKEN=$token UCX_TLS=tcp,self KOLO_HIERARCHICAL_ALLREDUCE=$hier \
      ip netns exec "$ns" "$bin/kolo-run" --nnodes 2 --node-rank "$node" --master-addr "$net.1" \
      --master-port "$port" -n 2 "$bin/kolo-bench" --backend ucx --engine --op allreduce \
      --min-bytes "$3" --max-bytes "$3" --iters 5 --warmup 1 --quiet \
      > "$out/$node.out" 2>"$out/$node.err" &
    pids+=($!)
  done
  wait "${pids[@]}" || { cat "$out"/*.err >&2; return 1; }
  grep -v '^#' "$out/0.out" | sed "s/^/$1 $2 /"
}
rows=$(for r in $(seq 1 "$rounds"); do
  for size in ${sizes//,/ }; do
    if [ $((r % 2)) = 1 ]; then run flat "$r" "$size"; run hier "$r" "$size"
    else run hier "$r" "$size"; run flat "$r" "$size"; fi
  done
done)
echo "$rows"
echo "$rows" | python3 -c '
import statistics, sys
times, wrong = {}, 0
for line in sys.stdin:
    p = line.split()
    if len(p) >= 7 and p[2].isdigit():
        times.setdefault((int(p[2]), p[0]), []).append(float(p[6]))
        wrong += int(p[-1]) if p[-1].isdigit() else 0
print(f"f32 sum allreduce, 2 hosts x 2 ranks shaped to '"$rate"', medians of '"$rounds"' rounds, {wrong} wrong elements:")
for size in sorted({s for s, _ in times}):
    flat, hier = statistics.median(times[(size, "flat")]), statistics.median(times[(size, "hier")])
    print(f"  {size / 2**20:g} MiB: flat {flat / 1e3:.1f} ms, hierarchical {hier / 1e3:.1f} ms: {flat / hier:.2f}x")
'
