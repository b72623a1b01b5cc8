#!/usr/bin/env bash
# The engine's fusion and latency numbers (issue #4) in one run: 1,000
# tensors of 4 KiB per step through the engine on 2 thread ranks, fused and
# with `--fusion-threshold 0`, for each way of submitting them (separate
# `allreduce_async` calls, one grouped call, and both inside a `Kolo::scope`
# — zero-copy — and one `kolo::TensorGroup` made before the timing, whose
# names the engine checks once, submitted with the blocking
# `Kolo::allreduce_group`), REPS times interleaved; then the 4-byte
# allreduce through the engine. Prints every run, then the medians and
# fused/unfused ratios.
#
#   scripts/bench-engine.sh                    # REPS=3 ITERS=40 WARMUP=5
#   BENCH=path/to/kolo-bench scripts/bench-engine.sh
#
# Runs the benchmark under SCHED_FIFO (`chrt -f 10`) when allowed: the
# backend's waits yield the CPU, and under the normal scheduler a yield
# hands it to any other runnable process, so a build running next to the
# benchmark would time the build. Set RT=0 to run without it.
set -euo pipefail

REPS=${REPS:-3}
ITERS=${ITERS:-40}
WARMUP=${WARMUP:-5}
RT=${RT:-1}

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
bench=${BENCH:-}
if [ -z "$bench" ]; then
  echo "bench-engine: building kolo-bench (release)" >&2
  (cd "$root" && cargo build --release -q -p kolo-bench)
  bench=$target/release/kolo-bench
fi

run=()
if [ "$RT" = 1 ] && chrt -f 10 true 2>/dev/null; then
  run=(chrt -f 10)
  echo "# scheduler: SCHED_FIFO 10"
else
  echo "# scheduler: default"
fi

modes=("" "--grouped" "--scoped" "--scoped --grouped" "--tensor-group")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
step="--engine --op allreduce --tensors 1000 --min-bytes 4000K --max-bytes 4000K --iters $ITERS --warmup $WARMUP"
for rep in $(seq "$REPS"); do
  for mode in "${modes[@]}"; do
    for fusion in "" "--fusion-threshold 0"; do
      # shellcheck disable=SC2086
      us=$("${run[@]}" "$bench" $step $mode $fusion | awk '$1 == 4096000 {print $5}')
      echo "$rep|${mode:-separate}|${fusion:-fused}|$us" | tee -a "$out"
    done
  done
  us=$("${run[@]}" "$bench" --engine --op allreduce --min-bytes 4 --max-bytes 4 \
    --iters $((ITERS * 75)) --warmup 200 | awk '$1 == 4 {print $5}')
  echo "$rep|4-byte allreduce||$us" | tee -a "$out"
done

python3 - "$out" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, mode, fusion, us = line.strip().split("|")
    if us:
        runs.setdefault((mode, fusion), []).append(float(us))
med = {k: statistics.median(v) for k, v in runs.items()}
print("\n| submission | fused (us/step) | --fusion-threshold 0 (us/step) | ratio |")
print("|---|---|---|---|")
for mode in ["separate", "--grouped", "--scoped", "--scoped --grouped", "--tensor-group"]:
    f, u = med.get((mode, "fused")), med.get((mode, "--fusion-threshold 0"))
    if f and u:
        print(f"| {mode} | {f:.0f} | {u:.0f} | {u / f:.2f}x |")
if ("4-byte allreduce", "") in med:
    print(f"\n4-byte allreduce through the engine: {med[('4-byte allreduce', '')]:.2f} us (median of medians)")
EOF
