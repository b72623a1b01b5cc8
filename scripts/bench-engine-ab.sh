#!/usr/bin/env bash
# Same-run comparison of two kolo-bench builds on issue #4's step: 1,000
# tensors of 4 KiB per step in one grouped call in a `Kolo::scope`, 2
# thread ranks, fused and with `--fusion-threshold 0`; the four runs
# interleaved N times, under SCHED_FIFO (see bench-engine.sh). Prints one
# line per round (base fused, base unfused, new fused, new unfused, us per
# step), then medians, the fused/unfused ratio of every round, and how much
# faster the new fused step is than the base's.
#
#   scripts/bench-engine-ab.sh path/to/base/kolo-bench path/to/new/kolo-bench [N=20]
#
# (A base build: `git worktree add /tmp/base <commit> && cargo build
# --release -p kolo-bench --manifest-path /tmp/base/Cargo.toml`.)
set -euo pipefail
base=$1
new=$2
n=${3:-20}
args=(--engine --op allreduce --tensors 1000 --min-bytes 4000K --max-bytes 4000K
  --iters 40 --warmup 5 --scoped --grouped)
run=()
if chrt -f 10 true 2>/dev/null; then run=(chrt -f 10); fi
t() { "${run[@]}" "$@" 2>/dev/null | awk '$1==4096000{print $5}'; }
out=$(for _ in $(seq "$n"); do
  echo "$(t "$base" "${args[@]}") $(t "$base" "${args[@]}" --fusion-threshold 0)" \
    "$(t "$new" "${args[@]}") $(t "$new" "${args[@]}" --fusion-threshold 0)"
done)
echo "$out"
echo "$out" | python3 -c '
import sys, statistics as s
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
bf, bu, nf, nu = zip(*rows)
ratio = lambda f, u: [b / a for a, b in zip(f, u)]
print("base: fused %.0f us, unfused %.0f us, median ratio %.2fx" % (s.median(bf), s.median(bu), s.median(ratio(bf, bu))))
print("new:  fused %.0f us, unfused %.0f us, median ratio %.2fx" % (s.median(nf), s.median(nu), s.median(ratio(nf, nu))))
print("new ratios, sorted:", " ".join("%.2f" % r for r in sorted(ratio(nf, nu))))
print("new fused step vs base fused step: %.2fx faster (median of rounds)" % s.median(ratio(nf, bf)))'
