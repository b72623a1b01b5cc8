#!/usr/bin/env bash
# Issue #4's step next to the machine's memory floor, interleaved N times
# in one run: `memory-floor` (the least memory traffic an in-place
# allreduce of 2 thread ranks moves for the same 4,096,000 bytes, with no
# library around it, in runs of 4 KiB as kolo-threads cuts 1,000 tensors of
# 4 KiB), then 1,000 x 4 KiB per step through the engine in one grouped
# call in a `Kolo::scope`, fused and with `--fusion-threshold 0`, and the
# same as one `kolo::TensorGroup` (`--tensor-group`: the blocking
# `Kolo::allreduce_group`), fused and not.
# Prints one line per round (floor, fused, unfused, group fused, group
# unfused, us), then the medians, the fused/unfused ratios, each fused step
# over the floor, and the ratio a fused step at the floor would give
# (unfused / floor: the ceiling).
#
#   scripts/bench-engine-floor.sh [N=12]        # builds kolo-bench first
#   BIN=path/to/release/dir scripts/bench-engine-floor.sh 20
#
# Under SCHED_FIFO when allowed, as bench-engine.sh.
set -euo pipefail
n=${1:-12}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-}
if [ -z "$bin" ]; then
  echo "bench-engine-floor: building kolo-bench (release)" >&2
  (cd "$root" && cargo build --release -q -p kolo-bench)
  bin=${CARGO_TARGET_DIR:-$root/target}/release
fi
args=(--engine --op allreduce --tensors 1000 --min-bytes 4000K --max-bytes 4000K
  --iters 40 --warmup 5)
run=()
if chrt -f 10 true 2>/dev/null; then run=(chrt -f 10); fi
engine() { "${run[@]}" "$bin/kolo-bench" "$@" 2>/dev/null | awk '$1==4096000{print $5}'; }
floor() {
  "${run[@]}" "$bin/memory-floor" --bytes 4000K --run 4K --iters 40 --warmup 5 |
    awk '$1==4096000{print $2}'
}
out=$(for _ in $(seq "$n"); do
  grouped=("${args[@]}" --scoped --grouped)
  group=("${args[@]}" --tensor-group)
  echo "$(floor) $(engine "${grouped[@]}") $(engine "${grouped[@]}" --fusion-threshold 0)" \
    "$(engine "${group[@]}") $(engine "${group[@]}" --fusion-threshold 0)"
done)
echo "$out"
echo "$out" | python3 -c '
import sys, statistics as s
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
fl, fu, un, gf, gu = zip(*rows)
med = s.median
print("medians: floor %.0f us; grouped: fused %.0f us, unfused %.0f us; tensor group: fused %.0f us, unfused %.0f us"
      % (med(fl), med(fu), med(un), med(gf), med(gu)))
for what, f, u in (("grouped", fu, un), ("tensor group", gf, gu)):
    ratios = [b / a for a, b in zip(f, u)]
    print("%s: fused/unfused ratio %.2fx (median of rounds; %d of %d rounds at 10x or more), fused step over the floor %.2fx"
          % (what, med(ratios), sum(r >= 10 for r in ratios), len(ratios), med([a / x for x, a in zip(fl, f)])))
print("ceiling (grouped unfused / floor): %.2fx" % med([u / x for x, u in zip(fl, un)]))'
