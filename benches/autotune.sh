#!/usr/bin/env bash
# KOLO_AUTOTUNE=1 against kolo's defaults on a workload where the default
# fusion threshold is poor: 2 thread ranks, 64 x 1 MiB f32 gradients per
# step (one allreduce_async each, in a scope), fp16-compressed. Rounds
# alternate the two; an autotuned run's 260 warm-up steps cover the tuning
# (at most 240 steps), so its timed steps run with the settled setting
# (the default's runs warm up for 10).
#
#   cargo build --release -p kolo-bench
#   bash benches/autotune.sh target/release/kolo-bench 5    # BIN ROUNDS
#
# Prints each run's median step time (and the setting autotuning settled
# on), then the median over the rounds of each and autotune's speed-up.
set -euo pipefail
bin=$1 rounds=${2:-5}
args=(--engine --tensors 64 --min-bytes 64M --max-bytes 64M --compression fp16
  --iters 100 --quiet)
declare -A times
for round in $(seq 1 "$rounds"); do
  for mode in default autotune; do
    if [ "$mode" = autotune ]; then
      out=$(KOLO_AUTOTUNE=1 KOLO_LOG_LEVEL=info "$bin" "${args[@]}" --warmup 260 2>&1)
    else
      out=$("$bin" "${args[@]}" --warmup 10 2>&1)
    fi
    t=$(awk '!/^#/ && NF == 8 {print $5}' <<<"$out")
    settled=$(grep -o 'autotune settled.*' <<<"$out" || true)
    echo "$mode round $round: $t us $settled"
    times[$mode]+="$t "
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
d=$(median <<<"${times[default]}") a=$(median <<<"${times[autotune]}")
echo "median step: default $d us, autotune $a us, speed-up $(awk -v d="$d" -v a="$a" 'BEGIN {printf "%.2fx", d / a}')"
