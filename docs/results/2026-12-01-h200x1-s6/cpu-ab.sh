#!/usr/bin/env bash
# Same-run A/B of the engine's repeated step on the H200 host's CPUs (threads
# backend, 1,000 x 4 KiB per step, scoped grouped), 2 ranks fused and with
# --fusion-threshold 0, then 1 rank fused: kb-prev (kolo-bench at 804c901,
# session 6's start) vs kb-new (at 2dc05db), both stripped release builds in
# gpu-dist/. Run on the device as: bash cpu-ab.sh gpu-dist [ROUNDS=10]
d=${1:-gpu-dist}
n=${2:-10}
args="--engine --op allreduce --tensors 1000 --min-bytes 4000K --max-bytes 4000K --iters 40 --warmup 5 --scoped --grouped"
t() { "$@" 2>/dev/null | awk '$1==4096000{print $5}'; }
for i in $(seq "$n"); do
  for b in kb-prev kb-new; do
    echo "$i $b fused $(t $d/$b $args) unfused $(t $d/$b $args --fusion-threshold 0) one-rank $(t $d/$b $args --ranks 1)"
  done
done
