#!/usr/bin/env bash
# Same-run A/B of the engine's repeated step on the host's CPUs (threads backend,
# 2 ranks, 1,000 x 4 KiB, scoped grouped): kb-prev (before the deferred books) vs kb-new.
# Run on the device as: cd gpu-dist && bash cpu-ab.sh (kb-prev: kolo-bench built at 74ea987, before the deferred books; kb-new: at 82a9140; both stripped release builds copied into gpu-dist/)
d=$(dirname "$0")
args="--engine --op allreduce --tensors 1000 --min-bytes 4000K --max-bytes 4000K --iters 40 --warmup 5 --scoped --grouped"
for i in 1 2 3 4 5 6; do
  for b in kb-prev kb-new; do
    f=$($d/$b $args 2>/dev/null | awk '$1==4096000{print $5}')
    u=$($d/$b $args --fusion-threshold 0 2>/dev/null | awk '$1==4096000{print $5}')
    echo "$i $b fused $f unfused $u"
  done
done
